"""A registered rank as the store keeps it, read back (``runtime/store_rows.py``)."""

from __future__ import annotations

import json

from perseus_server.domain.jobs import RankInfo
from perseus_server.runtime.store_rows import rank_from_json

RANK = RankInfo(
    job_id="j",
    rank_id="j-3-ab",
    global_rank=3,
    pipeline_rank=1,
    data_rank=1,
    tensor_rank=0,
    gpu_name="NVIDIA A40",
    supported_clocks=(1740, 1410, 210),
    hostname="node-3",
    max_power_limit_w=300.0,
)


def test_a_stored_rank_reads_back_equal() -> None:
    stored = json.loads(json.dumps(RANK.to_json()))  # as the store's text column holds it
    assert rank_from_json("j", stored) == RANK
    assert rank_from_json("other", stored).job_id == "other"  # the row's job, not the JSON's


def test_a_rank_stored_before_the_optional_keys_reads_with_their_defaults() -> None:
    old = {"rank_id": "r", "global_rank": "2", "pipeline_rank": 0, "data_rank": 1, "tensor_rank": 0}
    rank = rank_from_json("j", old)
    assert (rank.global_rank, rank.gpu_name, rank.supported_clocks) == (2, "", ())
    assert (rank.hostname, rank.max_power_limit_w) == ("", 0.0)
