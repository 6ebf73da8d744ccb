"""Dump ``/openapi.json`` and a fixed set of REST and gRPC answers of a real server, to compare trees.

Usage (from the repository root, with the tree's own environment)::

    python scripts/compare_answers.py dump DIR      # a real ``perseus serve``, asked in order
    python scripts/compare_answers.py compare A B   # the two dumps, ids and clocks left out

``dump`` starts ``perseus serve`` twice (open, then with a token and ``--zeus``), writes both
``/openapi.json`` documents as served, and the answers of one job's life in order (create,
profile, solve, four ranks registered over gRPC, the first ``WatchPlan`` message's bytes, plan
queries by every policy (each twice: the second from the kept bytes), bad input, deploy,
reports, stragglers, status, power budget, tenants, credentials, delete) to ``responses.txt``,
with ids, secrets and clock readings replaced. ``compare`` compares the documents byte for byte
and the answers line by line (ids and times that differ from run to run left out), and exits 1
on a difference. Refactors that promise the same behaviour run it on the tree before and after.
"""

from __future__ import annotations

import difflib
import re
import sys
import tempfile
import time
from pathlib import Path

ADMIN = "admin-token-0123456789"


def main_dump(out: Path) -> None:
    """Write the two OpenAPI documents and ``responses.txt`` under ``out``."""
    import grpc
    import httpx

    sys.path.insert(0, ".")
    from perseus_common.proto import perseus_pb2 as pb
    from perseus_common.proto import perseus_pb2_grpc as pb_grpc
    from perseus_server import ServerProcess
    from tests.server.conftest import register, sliced_profile_csv

    out.mkdir(parents=True, exist_ok=True)
    csv = sliced_profile_csv()
    log: list[str] = []
    ids: dict[str, str] = {}

    def norm(text: str) -> str:
        for real, name in sorted(ids.items(), key=lambda kv: -len(kv[0])):
            text = text.replace(real, name)
        text = re.sub(
            r'"(created|updated|started|finished|last_\w+_at|\w*_at|time_s|since|uptime_s|'
            r'elapsed_s|last_seen|issued|expires)":\s*[0-9.e+-]+',
            r'"\1": T',
            text,
        )
        text = re.sub(r"perseus-[a-z]+-[A-Za-z0-9_-]{20,}", "SECRET", text)
        return re.sub(
            r'"(uptime_seconds|solve_seconds|worker_pid|\w*seconds_ago|age_s)":\s*[0-9.e+-]+',
            r'"\1": N',
            text,
        )

    def rec(name: str, r: httpx.Response) -> httpx.Response:
        log.append(f"### {name}: {r.status_code} {r.headers.get('content-type')}\n{norm(r.text)}\n")
        return r

    def wait(c: httpx.Client, j: str) -> None:
        for _ in range(600):
            st = c.get(f"/jobs/{j}/frontier", params={"points": False}).json()
            if st["status"] in ("done", "failed"):
                return
            time.sleep(0.1)

    d = Path(tempfile.mkdtemp())
    for tok, zeus in ((None, False), (ADMIN, True)):
        args = ["--replan-dwell", "0"] + (["--zeus", "--zeus-plan-wait", "1"] if zeus else [])
        with (
            ServerProcess(d / f"p{bool(tok)}.db", token=tok, extra_args=args) as s,
            httpx.Client(base_url=s.http_url, headers=s.headers, timeout=60) as c,
        ):
            (out / f"openapi-{'token' if tok else 'open'}.json").write_bytes(
                c.get("/openapi.json").content
            )
            if not tok:
                continue
            rec("healthz", c.get("/healthz"))
            r = rec(
                "create",
                c.post(
                    "/jobs",
                    json={
                        "stages": 2,
                        "microbatches": 4,
                        "schedule": "1f1b",
                        "blocking_power": 70.38,
                        "gpu_model": "A40",
                        "data_parallel": 2,
                    },
                ),
            )
            j = r.json()["id"]
            ids[j] = "JOB1"
            rec("bad create", c.post("/jobs", json={"stages": -2, "microbatches": 4}))
            rec("plan before", c.get(f"/jobs/{j}/plan", params={"deadline": 1.0}))
            rec(
                "profile",
                c.put(f"/jobs/{j}/profile", content=csv, headers={"content-type": "text/csv"}),
            )
            rec(
                "bad profile",
                c.put(
                    f"/jobs/{j}/profile",
                    content="stage,instruction\n1,x",
                    headers={"content-type": "text/csv"},
                ),
            )
            rec("get profile", c.get(f"/jobs/{j}/profile"))
            rec("solve", c.post(f"/jobs/{j}/frontier"))
            wait(c, j)
            rec("frontier", c.get(f"/jobs/{j}/frontier"))
            ch = grpc.insecure_channel(s.grpc_target)
            stub = pb_grpc.PlanServiceStub(ch)
            md = s.grpc_metadata
            ranks = []
            for p in (0, 1, 2, 3):
                rr = register(stub, j, p, p % 2, data_rank=p // 2, metadata=md)
                ranks.append(rr.rank_id)
                ids[rr.rank_id] = f"RANK{p}"
                log.append(f"### grpc register {p}\n{norm(str(rr))}\n")
            try:
                register(stub, "nope", 0, 0, metadata=md)
            except grpc.RpcError as e:
                log.append(f"### grpc register bad\n{e.code()} {e.details()}\n")
            rec("deploy0", c.put(f"/jobs/{j}/plan", json={"slowdown": 0.05}))
            st = stub.WatchPlan(
                pb.WatchPlanRequest(job_id=j, rank_id=ranks[0]), metadata=md, timeout=30
            )
            m = next(st)
            log.append(f"### grpc watch\n{m.SerializeToString().hex()}\n")
            st.cancel()
            for q in (
                {"deadline": 1e9},
                {"slowdown": 0.1},
                {"slowdown": 0.1, "steps": True},
                {"index": 0},
                {"energy_budget": 1e9},
                {"eta": 0.5},
                {"eta": 0.5, "max_power": 900},
                {"deadline": -1},
                {"slowdown": "x"},
                {},
                {"slowdown": 0.1, "max_swing": 0.5},
                {"power_budget": 100000},
            ):
                rec(f"plan {q}", c.get(f"/jobs/{j}/plan", params=q))
                rec(f"plan again {q}", c.get(f"/jobs/{j}/plan", params=q))
            rec("deploy", c.put(f"/jobs/{j}/plan", json={"slowdown": 0.15, "pipelines": [0]}))
            rec("deploy bad", c.put(f"/jobs/{j}/plan", json={"slowdown": -1}))
            ack = stub.ReportIterations(
                iter(
                    [
                        pb.IterationReport(
                            job_id=j, rank_id=ranks[0], iteration=i, iteration_time=1.0
                        )
                        for i in range(3)
                    ]
                ),
                metadata=md,
                timeout=10,
            )
            log.append(f"### grpc report\n{ack.SerializeToString().hex()}\n")
            rec(
                "straggler",
                c.post(f"/jobs/{j}/stragglers", json={"pipeline": 0, "slowdown": 1.1}),
            )
            rec("clear", c.delete(f"/jobs/{j}/stragglers"))
            rec("detection", c.put(f"/jobs/{j}/straggler-detection", json={"threshold": 0.1}))
            rec("status", c.get(f"/jobs/{j}/status"))
            rec("job", c.get(f"/jobs/{j}"))
            rec("jobs", c.get("/jobs"))
            rec("profiling get", c.get(f"/jobs/{j}/profiling"))
            rec("budget put", c.put("/power-budget", json={"watts": 100000}))
            rec("budget get", c.get("/power-budget"))
            rec("budget del", c.delete("/power-budget"))
            rec("tenant create", c.post("/tenants", json={"id": "team-a", "max_jobs": 3}))
            rec("tenants", c.get("/tenants"))
            rec("tenant", c.get("/tenants/team-a"))
            rec("tenant patch", c.patch("/tenants/team-a", json={"max_jobs": 4}))
            r = rec("cred create", c.post("/credentials", json={"scope": "read"}))
            try:
                cj = r.json()
                ids[cj["id"]] = "CRED"
                ids[cj["token"]] = "TOKEN"
            except Exception:
                pass
            rec("creds", c.get("/credentials"))
            rec("cred del", c.delete(f"/credentials/{cj['id']}"))
            r = rec("rotate", c.post(f"/jobs/{j}/credentials/rotate"))
            try:
                for k, v in r.json().items():
                    if isinstance(v, str) and len(v) > 10:
                        ids[v] = f"ROT_{k}"
            except Exception:
                pass
            rec("creds2", c.get("/credentials"))
            rec("revoke job creds", c.delete(f"/jobs/{j}/credentials"))
            rec("finish", c.post(f"/jobs/{j}/finish"))
            rec("frontier del", c.delete(f"/jobs/{j}/frontier"))
            rec("del", c.delete(f"/jobs/{j}"))
            rec("tenant del", c.delete("/tenants/team-a"))
            rec("unknown", c.get("/jobs/0123456789abcdef/plan", params={"deadline": 1}))
            ch.close()
    (out / "responses.txt").write_text("\n".join(log))


def _normalised(path: Path) -> list[str]:
    text = path.read_text()
    text = re.sub(r"\b[0-9a-f]{16}\b", "HEX", text)
    text = re.sub(
        r'"(last_\w+|\w*time_ago|seconds_since\w*|recent_\w+)":\s*[0-9.e+-]+', r'"\1": V', text
    )
    text = re.sub(r"\b1[0-9]{9}(\.[0-9]+)?", "TS", text)
    return text.splitlines()


def main_compare(a: Path, b: Path) -> int:
    """0 when the dumps under ``a`` and ``b`` agree; else 1, the differences printed."""
    differ = 0
    for name in ("openapi-open.json", "openapi-token.json"):
        if (a / name).read_bytes() != (b / name).read_bytes():
            print(f"{name} differs")
            differ = 1
    old, new = _normalised(a / "responses.txt"), _normalised(b / "responses.txt")
    for line in difflib.unified_diff(old, new, lineterm="", n=0):
        print(line[:300])
        differ = 1
    print("same" if not differ else "different")
    return differ


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "dump":
        main_dump(Path(sys.argv[2]))
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        sys.exit(main_compare(Path(sys.argv[2]), Path(sys.argv[3])))
    else:
        sys.exit(__doc__)
