"""``perseus db migrate`` takes its destination whole or not at all, one migration at a time.

Real ``perseus db migrate`` processes, on real SQLite files and a real PostgreSQL database, into
each kind of destination (a SQLite file that does not exist yet, an empty SQLite file, an empty
PostgreSQL database):

- two migrations of two different sources at once into one destination: exactly one succeeds,
  the other is refused with a message naming why, and the destination holds exactly one
  source's data (never both merged, never a crash);
- a migration killed (SIGKILL) half way, after it wrote rows, leaves the destination as it was
  (absent, or empty), and the same migration run again succeeds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from perseus_server.domain.jobs import JobSpec, RankInfo
from perseus_server.domain.store import Store
from perseus_server.runtime.stores import open_store
from perseus_server.testing.postgres import PostgresServer

from .postgres_backend import database_for, postgres

__all__ = ["postgres"]  # the session's PostgreSQL server (a fixture)

pytestmark = pytest.mark.slow

#: Jobs per source, and iterations per job's rank: enough rows that a copy takes seconds.
JOBS, ITERATIONS = 40, 4000
KINDS = ("new-sqlite", "empty-sqlite", "postgres")


def _fill(store: Store, prefix: str) -> None:
    for j in range(JOBS):
        job_id = f"{prefix}-{j:03d}"
        store.add_job(job_id, JobSpec(stages=2, microbatches=4))
        store.put_rank(
            RankInfo(
                job_id=job_id,
                rank_id=f"{job_id}-0",
                global_rank=0,
                pipeline_rank=0,
                data_rank=0,
                tensor_rank=0,
                gpu_name="NVIDIA A40",
                supported_clocks=(1740, 1410),
                hostname="node",
                max_power_limit_w=300.0,
            )
        )
        rows = [(f"{job_id}-0", it, 1.0, 2.0, 1) for it in range(ITERATIONS)]
        store.add_iterations(job_id, rows, keep=ITERATIONS)


def _source(tmp: Path, prefix: str) -> str:
    path = str(tmp / f"{prefix}.db")
    store = open_store(path)
    try:
        _fill(store, prefix)
    finally:
        store.close()
    return path


def _destination(kind: str, postgres: PostgresServer, tmp: Path) -> str:
    if kind == "postgres":
        return database_for(postgres, tmp)
    path = tmp / "dst.db"
    if kind == "empty-sqlite":
        open_store(str(path)).close()
    return str(path)


def _jobs(target: str) -> set[str]:
    store = open_store(target)
    try:
        return {j.id for j in store.jobs()}
    finally:
        store.close()


def _migrate(src: str, dst: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "perseus", "db", "migrate", src, dst],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


@pytest.mark.parametrize("kind", KINDS)
def test_two_migrations_at_once_one_succeeds_the_other_is_refused(
    kind: str, postgres: PostgresServer, tmp_path: Path
) -> None:
    sources = {p: _source(tmp_path, p) for p in ("left", "right")}
    dst = _destination(kind, postgres, tmp_path)
    runs = {p: _migrate(src, dst) for p, src in sources.items()}
    done = {p: (proc.wait(600), *proc.communicate()) for p, proc in runs.items()}
    codes = sorted(rc for rc, _, _ in done.values())
    assert codes == [0, 1], done
    winner = next(p for p, (rc, _, _) in done.items() if rc == 0)
    loser = next(p for p, (rc, _, _) in done.items() if rc == 1)
    err = done[loser][2]
    assert err.startswith("perseus db migrate: "), err
    reasons = ("is under way", "is not empty", "was created while the copy ran")
    assert any(r in err for r in reasons), err
    assert "Traceback" not in err, err
    assert _jobs(dst) == {f"{winner}-{j:03d}" for j in range(JOBS)}


@pytest.mark.parametrize("kind", KINDS)
def test_a_migration_killed_half_way_leaves_the_destination_as_it_was(
    kind: str, postgres: PostgresServer, tmp_path: Path
) -> None:
    src = _source(tmp_path, "src")
    dst = _destination(kind, postgres, tmp_path)
    existed = kind != "new-sqlite"
    run = _migrate(src, dst)
    assert run.stdout is not None
    lines = []
    for line in run.stdout:  # the jobs are written (in its transaction): kill it
        lines.append(line)
        if line.startswith("perseus db: ranks:"):
            break
    run.send_signal(signal.SIGKILL)
    run.wait(60)
    assert run.returncode == -signal.SIGKILL, lines
    assert not any("copied" in line for line in lines), lines
    if existed:
        assert _jobs(dst) == set()
    else:
        assert not Path(dst).exists()
    again = _migrate(src, dst)
    out, err = again.communicate(timeout=600)
    assert again.returncode == 0, err
    assert _jobs(dst) == {f"src-{j:03d}" for j in range(JOBS)}
