"""The per-job gauges of ``/metrics`` (``service/job_gauges.py``), on real job state.

The samples ``/metrics`` shows a real server's scrape are ``tests/server/test_metrics_alerts.py``.
"""

from __future__ import annotations

from perseus_server.domain.jobs import JobSpec, RankInfo
from perseus_server.domain.rows import FrontierRow, JobRow
from perseus_server.domain.states import SolveStatus
from perseus_server.service.job_gauges import (
    CLOCK_CONTROL_NODES,
    clock_control_gauge,
    jobs_gauge,
    registered_gauge,
)
from perseus_server.service.state import Job, JobTable


def _table(*ids: str) -> JobTable:
    table = JobTable()
    spec = JobSpec(stages=2, microbatches=4)
    for job_id in ids:
        table.add(Job(row=JobRow(job_id, 0.0, spec), schedule=spec.build_schedule()))
    return table


def _rank(job: Job, g: int, host: str, control: str | None = None) -> None:
    rank = RankInfo(job.id, f"{job.id}-{g}", g, g % 2, g // 2, 0, "NVIDIA A40", (), host)
    job.ranks.add(rank)
    if control is not None:
        job.ranks.clock_control[rank.rank_id] = (control, "why")


def test_jobs_are_counted_per_state_and_none_is_one_zero_sample() -> None:
    assert jobs_gauge(JobTable()) == {(("state", "created"),): 0}
    table = _table("a", "b", "c")
    table.get("c").frontier.row = FrontierRow(SolveStatus.FAILED)
    assert jobs_gauge(table) == {(("state", "created"),): 2, (("state", "failed"),): 1}


def test_registered_ranks_per_job_with_ranks() -> None:
    table = _table("a", "b")
    for g in range(3):
        _rank(table.get("b"), g, "h")
    assert registered_gauge(table) == {(("perseus_job", "b"),): 3.0}


def test_ranks_without_clock_control_are_counted_per_node_bounded() -> None:
    table = _table("ok", "bad", "quiet")
    _rank(table.get("ok"), 0, "n0", "active")
    _rank(table.get("ok"), 1, "n0")  # never said: not counted
    bad = table.get("bad")
    for g in range(CLOCK_CONTROL_NODES + 3):  # one rank on each of 35 nodes, one more on n07
        _rank(bad, g, f"n{g:02d}", "unavailable")
    _rank(bad, 99, "n07", "unavailable")
    out = clock_control_gauge(table)
    assert out[(("perseus_job", "ok"), ("node", ""))] == 0.0
    assert not any(k[0] == ("perseus_job", "quiet") for k in out)  # no ranks: no sample
    bad_nodes = {k[1][1]: v for k, v in out.items() if k[0] == ("perseus_job", "bad")}
    assert bad_nodes["n07"] == 2.0  # the most first, then by name
    assert len(bad_nodes) == CLOCK_CONTROL_NODES + 1 and bad_nodes["other"] == 3.0
    assert sum(bad_nodes.values()) == CLOCK_CONTROL_NODES + 4
