"""The stored form of a registered rank, read back."""

from __future__ import annotations

from typing import Any

from perseus_server.domain.jobs import RankInfo

__all__ = ["rank_from_json"]


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
