"""What every store backend writes the same way.

The tables that hold a job's rows (deleted with it) and the stored form of a registered rank.
"""

from __future__ import annotations

from typing import Any

from perseus_server.domain.jobs import RankInfo

__all__ = ["JOB_TABLES", "rank_from_json"]

#: ``(table, column naming the job)`` of everything :meth:`Store.delete_job` forgets.
JOB_TABLES: tuple[tuple[str, str], ...] = (
    ("jobs", "id"),
    ("profiles", "job_id"),
    ("frontiers", "job_id"),
    ("deployments", "job_id"),
    ("ranks", "job_id"),
    ("iterations", "job_id"),
    ("profiling", "job_id"),
    ("report_sequences", "job_id"),
    ("credentials", "job_id"),
    ("rank_bindings", "job_id"),
    ("job_lifecycle", "job_id"),
)


def rank_from_json(job_id: str, d: dict[str, Any]) -> RankInfo:
    """A rank as stored (``RankInfo.to_json()``) read back."""
    return RankInfo(
        job_id=job_id,
        rank_id=d["rank_id"],
        global_rank=int(d["global_rank"]),
        pipeline_rank=int(d["pipeline_rank"]),
        data_rank=int(d["data_rank"]),
        tensor_rank=int(d["tensor_rank"]),
        gpu_name=d.get("gpu_name", ""),
        supported_clocks=tuple(int(c) for c in d.get("supported_clocks_mhz", [])),
        hostname=d.get("hostname", ""),
        max_power_limit_w=float(d.get("max_power_limit", 0.0)),
    )
