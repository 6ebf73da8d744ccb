"""The demo's orchestration (``perseus_demo.orchestration``): rank processes, the job hand-over.

Real processes: a small rank program (``python -m``, like :mod:`perseus_demo.rank`) written to
a temporary folder on ``PYTHONPATH``; a whole run is ``tests/demo/test_demo.py``'s.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from perseus_demo import DemoError
from perseus_demo.orchestration import _prepare_output, run_ranks, write_json
from perseus_demo.phases import JOB_FILE

#: A rank: notes its environment, waits for the job file like a demo rank, then does ``ACT``.
RANK = """
import json, os, sys, time
from pathlib import Path

cfg = json.loads(Path(sys.argv[2]).read_text())
out = Path(cfg["out_dir"])
rank = int(os.environ["RANK"])
(out / f"tmp{rank}").write_text(str(os.getpid()))
os.replace(out / f"tmp{rank}", out / f"pid{rank}")
job = out / "job.json"
while not job.is_file():
    time.sleep(0.02)
seen = {k: os.environ[k] for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "OMP_NUM_THREADS")}
(out / f"rank{rank}.json").write_text(json.dumps({"env": seen, "job": json.loads(job.read_text())}))
act = cfg["act"].get(str(rank), "exit")
if act == "fail":
    print(f"rank {rank} gives up", flush=True)
    sys.exit(3)
if act == "hang":
    time.sleep(600)
"""


@pytest.fixture
def rank_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "mod").mkdir()
    (tmp_path / "mod" / "fake_demo_rank.py").write_text(RANK)
    path = os.pathsep.join(p for p in (str(tmp_path / "mod"), os.environ.get("PYTHONPATH")) if p)
    monkeypatch.setenv("PYTHONPATH", path)
    return "fake_demo_rank"


def _rank_dir(tmp_path: Path) -> Path:
    return _prepare_output(tmp_path / "out", "stage,instruction,frequency,time,energy\n")


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_the_ranks_start_before_the_job_and_get_it_when_ready(
    tmp_path: Path, rank_module: str
) -> None:
    rank_dir = _rank_dir(tmp_path)
    started: list[int] = []

    def job() -> dict[str, object]:
        # the ranks are up meanwhile (the demo sets the job up on the server here)
        deadline = time.monotonic() + 60
        while len(list(rank_dir.glob("pid*"))) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        started.append(len(list(rank_dir.glob("pid*"))))
        assert not list(rank_dir.glob("rank*.json"))  # none went on without the job
        return {"job": "j1", "plan_version": 2}

    run_ranks({"out_dir": str(rank_dir), "act": {}}, 3, rank_dir, 60, rank_module, job=job)
    assert started == [3]
    docs = [json.loads((rank_dir / f"rank{r}.json").read_text()) for r in range(3)]
    assert [d["env"]["RANK"] for d in docs] == ["0", "1", "2"]
    assert {d["env"]["WORLD_SIZE"] for d in docs} == {"3"} and docs[0]["env"][
        "OMP_NUM_THREADS"
    ] == "1"
    assert all(d["job"] == {"job": "j1", "plan_version": 2} for d in docs)
    assert json.loads((rank_dir / "config.json").read_text())["out_dir"] == str(rank_dir)


def test_a_failed_rank_is_named_with_its_log_and_the_others_are_killed(
    tmp_path: Path, rank_module: str
) -> None:
    rank_dir = _rank_dir(tmp_path)
    cfg = {"out_dir": str(rank_dir), "act": {"0": "hang", "1": "fail"}}
    with pytest.raises(DemoError, match=r"rank 1 exited with status 3:\n.*rank 1 gives up"):
        run_ranks(cfg, 2, rank_dir, 60, rank_module, job=lambda: {})
    assert _gone(int((rank_dir / "pid0").read_text()))


def test_ranks_past_the_timeout_are_killed(tmp_path: Path, rank_module: str) -> None:
    rank_dir = _rank_dir(tmp_path)
    cfg = {"out_dir": str(rank_dir), "act": {"0": "hang"}}
    with pytest.raises(DemoError, match="the ranks did not finish within 2 s"):
        run_ranks(cfg, 1, rank_dir, 2, rank_module, job=lambda: {})
    assert _gone(int((rank_dir / "pid0").read_text()))


def test_a_job_that_cannot_be_set_up_stops_the_ranks(tmp_path: Path, rank_module: str) -> None:
    rank_dir = _rank_dir(tmp_path)

    def job() -> dict[str, object]:
        while not (rank_dir / "pid0").is_file():
            time.sleep(0.02)
        raise DemoError("--power-fraction: below the lowest power of any plan")

    with pytest.raises(DemoError, match="--power-fraction"):
        run_ranks({"out_dir": str(rank_dir), "act": {}}, 1, rank_dir, 60, rank_module, job=job)
    assert _gone(int((rank_dir / "pid0").read_text()))
    assert not (rank_dir / JOB_FILE).exists()


def test_an_output_folder_is_cleared_of_a_previous_runs_ranks_and_job(tmp_path: Path) -> None:
    rank_dir = _rank_dir(tmp_path)
    write_json(rank_dir / JOB_FILE, {"job": "old"})
    write_json(rank_dir / "rank0.json", {"steps": []})
    again = _prepare_output(tmp_path / "out", "stage,instruction\n")
    assert again == rank_dir and not list(rank_dir.iterdir())  # a new run's ranks wait for theirs
    assert (tmp_path / "out" / "profile.csv").read_text() == "stage,instruction\n"
