"""Failover of two ``perseus serve`` processes on one PostgreSQL database, under load.

    python benchmarks/failover.py [--rounds 3] [--ranks 1024] [--procs 4] [--lease 5] [--hang 30]
    python benchmarks/failover.py --smoke   # 3 rounds (one per fault), 16 ranks, a 2 s lease

Starts a PostgreSQL server (``initdb`` / ``pg_ctl``, PostgreSQL's default durability), a leader
and a standby with ``--leader-lease`` on fixed ports, each connecting as a database role of
its own (so that its connections alone can be cut), and solves a
2-stage job with ``ranks / 2`` data-parallel pipelines. ``--procs`` processes simulate the
ranks with the real gRPC API against both addresses (register, a ``WatchPlan`` stream to each
address, one sequence-numbered report per rank every ``--interval`` s). Each round deploys a
new plan version, waits until every rank has it, and faults the leader, the faults rotating:

- ``SIGKILL``: the leader dies;
- ``SIGSTOP``: the leader hangs for ``--hang`` s, then is resumed (SIGCONT) and must stop
  itself (exit status 3), having written nothing more;
- ``dbcut``: the leader's database connections are cut (its open connections terminated,
  new ones refused by ``pg_hba.conf``) until it has stopped itself, at least ``--cut`` s;
  PostgreSQL and the standby are fine.

Measured per round, from the fault: the standby's ``perseus: leader`` line, its readiness (both
ports listening), and the time until every rank has received a plan on its stream to the new
leader (median and max over the ranks; the goal is at most 10 s); acknowledged reports not in
the database ("lost"); ranks the new leader gave a plan version older than one they had
("back"). An audit trigger, installed by the benchmark, records which server (its
``application_name``) committed under which epoch: "two leaders" counts the epochs in which more
than one server committed. The faulted server is then started again as the next standby.

Needs PostgreSQL installed (Debian's ``postgresql``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import signal
import socket
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from failover_load import ranks_proc  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PROFILE = ROOT / "profiles" / "gpt3-175b_a40_8stage.csv"
STAGES, MICROBATCHES = 2, 4
FAULTS = ("SIGKILL", "SIGSTOP", "dbcut")
#: Installed by the benchmark (not the server): which server committed under which epoch.
AUDIT_SQL = """
CREATE TABLE IF NOT EXISTS bench_commits (epoch BIGINT, app TEXT, PRIMARY KEY (epoch, app));
CREATE OR REPLACE FUNCTION bench_audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO bench_commits SELECT epoch, current_setting('application_name')
    FROM perseus_epoch WHERE id = 1 ON CONFLICT DO NOTHING;
  RETURN NULL;
END $$;
"""
AUDITED = ("iterations", "deployments", "frontiers", "ranks", "report_sequences")


def _small_profile() -> str:
    lines = PROFILE.read_text().splitlines()
    keep = {f for f in sorted({int(x.split(",")[2]) for x in lines[1:]})[::10]}
    rows = [x for x in lines[1:] if int(x.split(",")[0]) < STAGES and int(x.split(",")[2]) in keep]
    return "\n".join([lines[0], *rows]) + "\n"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_line(srv: Any, text: str, timeout: float, after: int = 0) -> float:
    deadline = time.monotonic() + timeout
    while text not in srv.output()[after:]:
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {text!r} after {timeout} s:\n{srv.output()[-3000:]}")
        time.sleep(0.01)
    return time.monotonic()


class Slot:
    """One server's place: fixed ports, its own database role, the process running there.

    The role of its own lets the benchmark cut this server's connections alone.
    """

    def __init__(self, name: str, cluster: Cluster) -> None:
        self.name, self.cluster, self.gen = name, cluster, 0
        self.http_port, self.grpc_port = _free_port(), _free_port()
        self.role = f"perseus_{name}"
        cluster.sql(f"CREATE ROLE {self.role} LOGIN SUPERUSER")
        self.srv: Any = None
        self.waiting: threading.Thread | None = None
        self._hba: str | None = None

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def cut(self) -> None:
        """Cut this server off the database; PostgreSQL and the other server go on.

        Its role's connections are refused (``pg_hba.conf``) and the open ones terminated.
        """
        hba = self.cluster.pg.data / "pg_hba.conf"
        self._hba = hba.read_text()
        hba.write_text(
            f"local all {self.role} reject\nhost all {self.role} all reject\n{self._hba}"
        )
        self.cluster.sql("SELECT pg_reload_conf()")
        for _ in range(10):  # a connection made before the reload took effect is ended too
            self.cluster.sql(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                (self.role,),
            )
            time.sleep(0.1)

    def restore(self) -> None:
        if self._hba is not None:
            (self.cluster.pg.data / "pg_hba.conf").write_text(self._hba)
            self._hba = None
            self.cluster.sql("SELECT pg_reload_conf()")

    def launch(self) -> None:
        """Start a new server process here (``start`` returns once it leads: on a thread)."""
        from perseus_server import ServerProcess

        c = self.cluster
        self.gen += 1
        url = (
            f"postgresql://{self.role}@/{c.db}?host={c.pg.dir}&port={c.pg.port}"
            f"&application_name=perseus-{self.name}{self.gen}"
        )
        self.srv = ServerProcess(
            url,
            http_port=self.http_port,
            grpc_port=self.grpc_port,
            startup_timeout=24 * 3600.0,  # a standby waits for as long as the leader leads
            extra_args=["--leader-lease", str(c.lease)],
        )
        srv = self.srv

        def run() -> None:
            with contextlib.suppress(RuntimeError):  # stopped while a standby, at the end
                srv.start()

        self.waiting = threading.Thread(target=run, daemon=True)
        self.waiting.start()

    def close(self) -> None:
        if self.srv is not None:
            if self.srv.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.srv.pid, signal.SIGCONT)
            self.srv.stop()


class Cluster:
    """PostgreSQL, two server slots (leader and standby) and the simulated ranks."""

    def __init__(self, pg: Any, lease: float) -> None:
        self.ctx = mp.get_context("spawn")
        self.pg, self.lease = pg, lease
        self.db = "failover"
        pg.create_database(self.db)
        self.slots = [Slot("a", self), Slot("b", self)]
        self.leader = 0
        self.loads: list[tuple[Any, Any]] = []

    def sql(self, query: str, params: tuple[Any, ...] = ()) -> None:
        """Run ``query`` as the database's superuser."""
        import psycopg

        with psycopg.connect(self.pg.url(self.db), autocommit=True) as conn:
            conn.execute(query, params)

    def ask(self, *cmd: Any) -> list[Any]:
        for pipe, _ in self.loads:
            pipe.send(cmd)
        return [pipe.recv() for pipe, _ in self.loads]

    def start_load(self, job_id: str, ranks: int, procs: int, interval: float) -> None:
        targets = [s.target for s in self.slots]
        pipelines = max(1, ranks // STAGES)
        ids = [(d * STAGES + s, s, d) for d in range(pipelines) for s in range(STAGES)]
        for k in range(procs):
            a, b = self.ctx.Pipe()
            p = self.ctx.Process(
                target=ranks_proc, args=(targets, job_id, ids[k::procs], interval, b), daemon=True
            )
            p.start()
            self.loads.append((a, p))
        for a, _ in self.loads:
            assert a.recv()[0] == "registered"

    def plans_since(self, t0: float, slot: int, min_version: int, timeout: float) -> dict[str, Any]:
        """Wait until every rank has a plan of ``min_version`` or more from ``slot`` since ``t0``.

        Returns after ``timeout`` s at most: the delays of the ranks that have one, and the
        ranks given a version older than one they had.
        """
        deadline = time.monotonic() + timeout
        while True:
            got = self.ask("plans_since", t0, slot, min_version)
            ranks, have = sum(g["ranks"] for g in got), sum(g["have"] for g in got)
            if have == ranks or time.monotonic() > deadline:
                delays = sorted(d for g in got for d in g["delays"])
                return {
                    "ranks": ranks,
                    "have": have,
                    "delays": delays,
                    "back": sum(g["back"] for g in got),
                }
            time.sleep(0.1)

    def lost(self, acked: list[tuple[str, int]]) -> int:
        """Acknowledged reports (rank id, iteration) that the database does not hold."""
        import psycopg

        if not acked:
            return 0
        with psycopg.connect(self.pg.url(self.db), autocommit=True) as conn:
            rows = conn.execute(
                "SELECT rank_id, iteration FROM iterations WHERE iteration >= %s",
                (min(it for _, it in acked),),
            ).fetchall()
        return len(set(acked) - {(r, int(i)) for r, i in rows})

    def audit(self, install: bool = False) -> dict[int, list[str]]:
        """Install the commit audit, or read it: the servers that committed, per epoch."""
        import psycopg

        with psycopg.connect(self.pg.url(self.db), autocommit=True) as conn:
            if install:
                conn.execute(AUDIT_SQL)
                for t in AUDITED:
                    conn.execute(
                        f"CREATE TRIGGER bench_audit AFTER INSERT OR UPDATE OR DELETE ON {t} "
                        "FOR EACH STATEMENT EXECUTE FUNCTION bench_audit()"
                    )
                return {}
            out: dict[int, list[str]] = {}
            for epoch, app in conn.execute("SELECT epoch, app FROM bench_commits ORDER BY 1, 2"):
                out.setdefault(int(epoch), []).append(str(app))
            return out

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.ask("stop")
        for _, p in self.loads:
            p.join(10)
        for s in self.slots:
            s.close()


def _setup(cl: Cluster, args: argparse.Namespace) -> str:
    """Start the leader and the standby, solve the job, install the audit, start the ranks."""
    import httpx

    lead = cl.slots[0]
    lead.launch()
    assert lead.waiting is not None
    lead.waiting.join(120)
    with httpx.Client(base_url=lead.srv.http_url, timeout=120.0) as http:
        spec = {
            "stages": STAGES,
            "microbatches": MICROBATCHES,
            "data_parallel": max(1, args.ranks // STAGES),
        }
        job_id = str(http.post("/jobs", json={**spec, "blocking_power": 70.38}).json()["id"])
        http.put(
            f"/jobs/{job_id}/profile",
            content=_small_profile(),
            headers={"content-type": "text/csv"},
        ).raise_for_status()
        http.post(f"/jobs/{job_id}/frontier").raise_for_status()
        while http.get(f"/jobs/{job_id}/frontier", params={"points": False}).json()[
            "status"
        ] not in ("done", "failed"):
            time.sleep(0.1)
    cl.audit(install=True)
    cl.slots[1].launch()
    _wait_line(cl.slots[1].srv, "perseus: standby", 120)
    cl.start_load(job_id, args.ranks, args.procs, args.interval)
    return job_id


def _fault(cl: Cluster, fault: str, hang: float) -> threading.Timer | None:
    """Fault the leader; for SIGSTOP, return the timer that resumes it ``hang`` s later.

    The timer resumes it whatever happens meanwhile: a standby that waits for the hung leader
    must not wait for the benchmark.
    """
    old = cl.slots[cl.leader]
    if fault == "SIGKILL":
        old.srv.kill()
    elif fault == "SIGSTOP":
        os.kill(old.srv.pid, signal.SIGSTOP)
        resume = threading.Timer(hang, os.kill, (old.srv.pid, signal.SIGCONT))
        resume.start()
        return resume
    else:
        old.cut()
    return None


def _end_fault(
    cl: Cluster, fault: str, t0: float, args: argparse.Namespace, resume: threading.Timer | None
) -> int | None:
    """Wait for the faulted leader to stop; its exit status (None after SIGKILL).

    Resumed or reconnected as the fault says.
    """
    old = cl.slots[cl.leader]
    if fault == "SIGKILL":
        return None
    if resume is not None:
        resume.join()
    deadline = time.monotonic() + 120
    while old.srv.returncode is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if fault == "dbcut":
        time.sleep(max(0.0, t0 + args.cut - time.monotonic()))
        old.restore()
    code = old.srv.returncode
    if code is None:
        old.srv.kill()
    return code


def _merged(counts: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in counts:
        for k, v in c.items():
            out[k] = out.get(k, 0) + v
    return out


def _round(
    cl: Cluster, job_id: str, i: int, fault: str, args: argparse.Namespace
) -> dict[str, Any]:
    import httpx

    old, new = cl.slots[cl.leader], cl.slots[1 - cl.leader]
    t_dep = time.time()
    with httpx.Client(base_url=old.srv.http_url, timeout=60.0) as http:
        deployed = int(http.put(f"/jobs/{job_id}/plan", json={"index": i % 2}).json()["version"])
    push = cl.plans_since(t_dep, cl.leader, deployed, 60)
    time.sleep(args.settle)  # reports flow to the leader
    offset = len(new.srv.output())
    t0, m0 = time.time(), time.monotonic()
    resume = _fault(cl, fault, args.hang)
    to_leader = _wait_line(new.srv, "perseus: leader", 120, offset) - m0
    assert new.waiting is not None
    new.waiting.join(120)
    to_ready = time.monotonic() - m0
    plans = cl.plans_since(t0, 1 - cl.leader, 0, 120)
    exit_code = _end_fault(cl, fault, m0, args, resume)
    time.sleep(args.settle)  # reports flow to the new leader
    drained = cl.ask("drain")
    acked = [tuple(a) for d in drained for a in d["acked"]]
    delays = plans["delays"]
    row = {
        "round": i + 1,
        "fault": fault,
        "to_leader_s": to_leader,
        "to_ready_s": to_ready,
        "plans_median_s": statistics.median(delays) if delays else None,
        "plans_max_s": max(delays) if len(delays) == plans["ranks"] and delays else None,
        "ranks": plans["ranks"],
        "ranks_with_plan": plans["have"],
        "push_before_s": max(push["delays"], default=None),
        "deployed_version": deployed,
        "version_went_back": plans["back"],
        "deposed_exit": exit_code,
        "acked": len(acked),
        "lost": cl.lost(acked),
        "failed_sends": sum(d["failed_sends"] for d in drained),
        "partial_acks": sum(d["partial_acks"] for d in drained),
        "send_errors": _merged(d["errors"] for d in drained),
    }
    cl.leader = 1 - cl.leader
    old.launch()
    try:
        _wait_line(old.srv, "perseus: standby", 120)
    except RuntimeError as e:
        raise RuntimeError(f"{e}\nthe leader's output:\n{new.srv.output()[-3000:]}") from None
    return row


def run(args: argparse.Namespace, faults: list[str]) -> dict[str, Any]:
    """Run one failover per entry of ``faults``; the rounds and the epochs' committers."""
    from perseus_server.testing.postgres import PostgresServer

    rows: list[dict[str, Any]] = []
    with PostgresServer(durable=True) as pg:
        cl = Cluster(pg, args.lease)
        try:
            job_id = _setup(cl, args)
            for i, fault in enumerate(faults):
                rows.append(_round(cl, job_id, i, fault, args))
                print(_line(rows[-1]), file=sys.stderr, flush=True)
            commits = cl.audit()
        finally:
            cl.close()
    load = os.getloadavg()
    return {
        "lease_s": args.lease,
        "hang_s": args.hang,
        "cut_s": args.cut,
        "ranks": args.ranks,
        "procs": args.procs,
        "interval_s": args.interval,
        "loadavg": list(load),
        "rounds": rows,
        "commits_by_epoch": {str(k): v for k, v in commits.items()},
        "two_leaders_in_an_epoch": sum(1 for v in commits.values() if len(v) > 1),
    }


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


HEADER = (
    f"{'#':>3} {'fault':<8} {'leader s':>9} {'ready s':>8} {'plans p50':>10} {'plans max':>10} "
    f"{'ranks':>11} {'push s':>7} {'back':>5} {'deposed':>8} {'acked':>7} {'lost':>5}"
)


def _line(r: dict[str, Any]) -> str:
    return (
        f"{r['round']:>3} {r['fault']:<8} {r['to_leader_s']:>9.2f} {r['to_ready_s']:>8.2f} "
        f"{_fmt(r['plans_median_s']):>10} {_fmt(r['plans_max_s']):>10} "
        f"{r['ranks_with_plan']:>5}/{r['ranks']:<5} {_fmt(r['push_before_s']):>7} "
        f"{r['version_went_back']:>5} {str(r['deposed_exit'] or '-'):>8} {r['acked']:>7} {r['lost']:>5}"
    )


def report(res: dict[str, Any]) -> bool:
    """Print the table and the summary; whether every invariant held and every goal was met."""
    rows = res["rounds"]
    print(
        f"lease {res['lease_s']:g} s, hang {res['hang_s']:g} s, cut >= {res['cut_s']:g} s; "
        f"{res['ranks']} ranks in {res['procs']} processes, a report each every "
        f"{res['interval_s']:g} s; times from the fault; load {res['loadavg'][0]:.1f}"
    )
    print(HEADER)
    for r in rows:
        print(_line(r))
    ok = True
    for fault in FAULTS:
        got = [r for r in rows if r["fault"] == fault]
        if got:
            worst = [r["plans_max_s"] for r in got]
            missing = any(w is None for w in worst)
            top = (
                max(w for w in worst if w is not None)
                if not all(w is None for w in worst)
                else None
            )
            print(
                f"{fault}: new leader after {statistics.median(r['to_leader_s'] for r in got):.2f} s "
                f"median; every rank has its plan after {_fmt(top)} s at worst"
                + (" (some ranks never got one)" if missing else "")
            )
            ok = ok and not missing and top is not None and top <= 10.0
    lost = sum(r["lost"] for r in rows)
    back = sum(r["version_went_back"] for r in rows)
    deposed_ok = all(r["deposed_exit"] in (None, 3) for r in rows)
    print(
        f"acknowledged reports lost: {lost} of {sum(r['acked'] for r in rows)}; versions went back: "
        f"{back}; epochs with two committing leaders: {res['two_leaders_in_an_epoch']} of "
        f"{len(res['commits_by_epoch'])}; faulted leaders that stopped themselves: "
        f"{'all' if deposed_ok else 'NOT all'}"
    )
    return ok and lost == 0 and back == 0 and res["two_leaders_in_an_epoch"] == 0 and deposed_ok


def parser(doc: str) -> argparse.ArgumentParser:
    """The options the failover benchmarks share."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=1024, help="simulated ranks")
    ap.add_argument("--procs", type=int, default=4, help="processes the ranks run in")
    ap.add_argument("--interval", type=float, default=1.0, help="s between a rank's reports")
    ap.add_argument("--lease", type=float, default=5.0, help="--leader-lease of both servers")
    ap.add_argument("--hang", type=float, default=30.0, help="s a SIGSTOPped leader hangs")
    ap.add_argument("--cut", type=float, default=10.0, help="s (at least) a database cut lasts")
    ap.add_argument("--settle", type=float, default=2.0, help="s of reports around each fault")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__ or "")
    ap.add_argument("--rounds", type=int, default=3, help="failovers, the faults rotating")
    ap.add_argument("--faults", default=",".join(FAULTS), help="the faults, in turn")
    ap.add_argument("--smoke", action="store_true", help="3 rounds, 16 ranks, a 2 s lease")
    args = ap.parse_args(argv)
    faults = args.faults.split(",")
    if not set(faults) <= set(FAULTS):
        ap.error(f"--faults: each must be one of {', '.join(FAULTS)}")
    if args.smoke:
        args.rounds, args.ranks, args.procs, args.lease = 3, 16, 1, 2.0
        args.hang, args.cut, args.settle, args.interval = 3.0, 3.0, 1.0, 0.5
    res = run(args, [faults[i % len(faults)] for i in range(args.rounds)])
    if args.json:
        print(json.dumps(res))
        return 0
    return 0 if report(res) else 1


if __name__ == "__main__":
    sys.exit(main())
