"""The starvation scenario of issue #31: can one tenant push another off its power budget?

    python benchmarks/tenancy.py [--json]
    python benchmarks/tenancy.py --smoke        # the suite's (the same steps, 2 stages)

Starts ``perseus serve`` (a temporary database, an admin token), sets a cluster power budget
of ``--budget`` W (1,500) with policy ``fair``, and walks these steps, printing after each
every job's slowdown under the budget, the budget's feasibility and tenant A's watts:

0. tenant A's job (4 stages x 8 microbatches, the A40 profile: 765.8 W at its fastest plan)
   runs: its ranks are connected;
1. tenant B creates a 1,024-pipeline job (``data_parallel`` 1024), uploads its profile and
   solves it, and never starts it;
2. tenant B creates a one-pipeline job (4 GPUs) claiming ``blocking_power`` 10,000 W per GPU,
   solved, never started;
3. tenant B's two jobs start (the ranks of one pipeline of each connect, saying they are A40s:
   since issue #39 a pipeline draws only once all its ranks are connected);
4. the admin gives tenant A a guaranteed 800 W.

It runs on a server without tenants too (the code before them): tenants are then skipped and
every job is the admin's, so the same script shows before and after. A's slowdown must stay 0
at steps 1 and 2 (jobs that never start draw nothing), and from step 4 on (its guarantee).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PROFILE = ROOT / "profiles" / "gpt3-175b_a40_8stage.csv"
ADMIN = "tenancy-benchmark-admin-token"


def sliced_csv(stages: int, every: int = 10) -> str:
    """The A40 profile cut to ``stages`` stages and every ``every``-th clock."""
    from perseus.profiles import load_profile

    p = load_profile(PROFILE)
    keep = set(p.frequencies[::every])
    rows = [r for r in p.records() if r["stage"] < stages and r["frequency"] in keep]
    return "stage,instruction,frequency,time,energy\n" + "".join(
        f"{r['stage']},{r['instruction']},{r['frequency']},{r['time']!r},{r['energy']!r}\n"
        for r in rows
    )


class Scenario:
    """The server, its clients, and the jobs of the scenario."""

    def __init__(self, srv: Any, stages: int, microbatches: int) -> None:
        import grpc
        import httpx

        from perseus_common.proto import perseus_pb2_grpc as pb_grpc

        self.srv = srv
        self.admin = httpx.Client(
            base_url=srv.http_url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=120
        )
        self.channel = grpc.insecure_channel(srv.grpc_target)
        self.stub = pb_grpc.PlanServiceStub(self.channel)
        self.stages, self.microbatches = stages, microbatches
        self.csv = sliced_csv(stages)
        self.tenancy = self.admin.get("/tenants").status_code == 200
        self.clients: dict[str, Any] = {}
        self.streams: list[Any] = []
        self.jobs: dict[str, tuple[str, str]] = {}  # label -> (job id, rank credential)

    def tenant(self, name: str) -> Any:
        """A client with tenant ``name``'s credential (the admin's without tenants)."""
        import httpx

        if not self.tenancy:
            return self.admin
        if name not in self.clients:
            assert self.admin.post("/tenants", json={"id": name}).status_code == 201
            r = self.admin.post("/credentials", json={"scope": "tenant", "tenant": name})
            assert r.status_code == 201, r.text
            headers = {"Authorization": f"Bearer {r.json()['credential']}"}
            self.clients[name] = httpx.Client(
                base_url=self.srv.http_url, headers=headers, timeout=120
            )
        return self.clients[name]

    def job(self, label: str, tenant: str, **spec: Any) -> str:
        """Create, profile and solve a job of ``tenant``; wait for its frontier."""
        c = self.tenant(tenant)
        body = {"stages": self.stages, "microbatches": self.microbatches, "name": label, **spec}
        body.setdefault("blocking_power", 70.38)
        r = c.post("/jobs", json=body)
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
        self.jobs[label] = (job_id, r.json().get("rank_credential", ADMIN))
        r = c.put(f"/jobs/{job_id}/profile", content=self.csv, headers={"content-type": "text/csv"})
        assert r.status_code == 200, r.text
        assert c.post(f"/jobs/{job_id}/frontier").status_code == 202
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            st = c.get(f"/jobs/{job_id}/frontier?points=false").json()
            if st["status"] == "done":
                return str(job_id)
            assert st["status"] in ("queued", "running", "partial"), st
            time.sleep(0.2)
        raise TimeoutError(f"job {label} was not solved in time")

    def start(self, label: str) -> None:
        """The ranks of the job's first pipeline register (as A40s); the first watches its plans.

        A pipeline draws on the budget only once every rank of it is registered (since
        issue #39; before, one rank made the whole job draw).
        """
        from perseus_common.proto import perseus_pb2 as pb

        job_id, token = self.jobs[label]
        md = (("authorization", f"Bearer {token}"),)
        ranks = [
            self.stub.RegisterRank(
                pb.RegisterRankRequest(
                    job_id=job_id, global_rank=g, pipeline_rank=g, gpu_name="NVIDIA A40",
                    hostname="node-0", max_power_limit_w=300.0,
                ),
                metadata=md, timeout=30,
            )
            for g in range(self.stages)
        ]  # fmt: skip
        stream = self.stub.WatchPlan(
            pb.WatchPlanRequest(job_id=job_id, rank_id=ranks[0].rank_id), metadata=md
        )
        next(stream)  # connected: its first plan arrived
        self.streams.append(stream)

    def row(self, step: str) -> dict[str, Any]:
        """Every job's slowdown (0: at its own fastest plan) and the budget's state, once settled.

        Settled: budget recomputations are merged over half a second.
        """
        time.sleep(1.0)
        budget = self.admin.get("/power-budget").json()
        shares = {j["id"]: j for j in budget["jobs"]}
        out: dict[str, Any] = {"step": step, "feasible": budget["feasible"]}
        for label, (job_id, _) in self.jobs.items():
            share = shares.get(job_id)
            out[label] = {
                "slowdown": 0.0 if share is None else share["slowdown"],
                "watts": None if share is None else share["watts"],
                "drawing": share is not None,
            }
        return out

    def close(self) -> None:
        for s in self.streams:
            s.cancel()
        self.channel.close()
        self.admin.close()
        for c in self.clients.values():
            c.close()


def run(budget: float, stages: int, microbatches: int, pipelines: int) -> list[dict[str, Any]]:
    from perseus_server import ServerProcess

    rows = []
    with (
        tempfile.TemporaryDirectory() as d,
        ServerProcess(Path(d) / "perseus.db", token=ADMIN) as srv,
    ):
        sc = Scenario(srv, stages, microbatches)
        try:
            sc.job("A", "team-a")
            sc.start("A")
            r = sc.admin.put("/power-budget", json={"watts": budget, "policy": "fair"})
            assert r.status_code == 200, r.text
            rows.append(sc.row("0: A runs"))
            sc.job("B-1024", "team-b", data_parallel=pipelines)
            rows.append(sc.row(f"1: B's {pipelines}-pipeline job solved, never started"))
            sc.job("B-10kW", "team-b", data_parallel=1, blocking_power=10000.0)
            rows.append(sc.row(f"2: B's {stages}-GPU job claims 10 kW/GPU, never started"))
            sc.start("B-1024")
            sc.start("B-10kW")
            rows.append(sc.row("3: B's two jobs start"))
            if sc.tenancy:
                r = sc.admin.patch("/tenants/team-a", json={"guaranteed_watts": 800})
                assert r.status_code == 200, r.text
            rows.append(sc.row("4: A guaranteed 800 W" + ("" if sc.tenancy else " (n/a)")))
        finally:
            sc.close()
    return rows


def _fmt(x: Any) -> str:
    return "-" if x is None else f"{x:.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budget", type=float, default=1500.0)
    ap.add_argument("--pipelines", type=int, default=1024)
    ap.add_argument("--smoke", action="store_true", help="2 stages, 4 microbatches, 64 pipelines")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    stages, microbatches, pipelines, budget = 4, 8, args.pipelines, args.budget
    if args.smoke:
        stages, microbatches, pipelines, budget = 2, 4, 64, budget / 2
    rows = run(budget, stages, microbatches, pipelines)
    if args.json:
        json.dump(rows, sys.stdout, indent=1)
        print()
        return
    labels = [k for k in rows[-1] if k not in ("step", "feasible")]
    print(f"budget {budget:g} W, policy fair; slowdown % (watts drawn; - : not drawing)")
    print(f"{'step':58s} {'feasible':9s} " + " ".join(f"{k:>18s}" for k in labels))
    for r in rows:
        cells = []
        for k in labels:
            v = r.get(k)
            cells.append(
                f"{'':>18s}"
                if v is None
                else f"{100 * v['slowdown']:7.1f} ({_fmt(v['watts']):>7s})"
            )
        print(f"{r['step']:58s} {str(r['feasible']):9s} " + " ".join(f"{c:>18s}" for c in cells))


if __name__ == "__main__":
    main()
