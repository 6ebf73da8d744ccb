"""``domain/jobs.py``: a job as the scheduler sees it, validated against the server's limits.

Every bound refused names its field; an explicit per-rank order is bounded by the job's own
numbers before a schedule is built from it; what is stored reads back as the same job.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from perseus_server.config import Limits
from perseus_server.domain.errors import BadRequest
from perseus_server.domain.jobs import JobSpec, RankInfo

#: 1F1B's orders for 2 ranks and 2 microbatches (``make_schedule("1f1b", 2, 2).to_json()``).
ORDERS = (
    (("forward", 0, 0), ("forward", 1, 0), ("backward", 0, 0), ("backward", 1, 0)),
    (("forward", 0, 1), ("backward", 0, 1), ("forward", 1, 1), ("backward", 1, 1)),
)


def _refused(spec: JobSpec, limits: Limits | None = None) -> BadRequest:
    with pytest.raises(BadRequest) as e:
        spec.validate(limits or Limits())
    return e.value


@pytest.mark.parametrize(
    ("spec", "field", "says"),
    [
        (JobSpec(stages=0, microbatches=4), "stages", "between 1 and 128, got 0"),
        (JobSpec(stages=2, microbatches=2000), "microbatches", "between 1 and 1024"),
        (
            JobSpec(stages=2, microbatches=4, schedule="interleaved-1f1b", virtual_stages=17),
            "schedule.virtual_stages",
            "between 1 and 16",
        ),
        (JobSpec(stages=2, microbatches=4, tensor_parallel=65), "tensor_parallel", "1 and 64"),
        (JobSpec(stages=128, microbatches=4, data_parallel=1024), "data_parallel", "65536 ranks"),
        (JobSpec(2, 4, blocking_power=float("nan")), "blocking_power", "in [0, 10000], got nan"),
        (JobSpec(stages=128, microbatches=1024), "microbatches", "exceeds 32768 instructions"),
        (JobSpec(stages=2, microbatches=4, schedule="zigzag"), "schedule", "unknown schedule"),
    ],
)
def test_each_bound_refused_names_its_field(spec: JobSpec, field: str, says: str) -> None:
    err = _refused(spec)
    assert err.field == field and says in err.detail, (err.field, err.detail)


def test_a_valid_job_builds_its_schedule() -> None:
    spec = JobSpec(stages=2, microbatches=4, data_parallel=3, tensor_parallel=2)
    sched = spec.validate(Limits())
    assert (sched.ranks, sched.microbatches, spec.world_size) == (2, 4, 12)


@pytest.mark.parametrize(
    ("orders", "says"),
    [
        (ORDERS[:1], "the explicit order has 1 ranks but the job has stages=2"),
        (((("sideways", 0, 0),), ORDERS[1]), "orders[0][0]: unknown instruction 'sideways'"),
        ((ORDERS[0], (("forward", 2, 1),)), "orders[1][0]: microbatch must be between 0 and 1"),
        (((("forward", 0, 10**9),), ORDERS[1]), "model stage must be between 0 and 31"),
    ],
)
def test_an_explicit_order_is_bounded_by_the_jobs_numbers(
    orders: tuple[tuple[tuple[str, int, int], ...], ...], says: str
) -> None:
    err = _refused(JobSpec(stages=2, microbatches=2, schedule="custom", orders=orders))
    assert err.field == "schedule.orders" and says in err.detail, err.detail


def test_an_explicit_order_longer_than_the_limit_is_refused_before_it_is_read() -> None:
    spec = JobSpec(stages=2, microbatches=2, schedule="custom", orders=ORDERS)
    err = _refused(spec, replace(Limits(), max_instructions=7))
    assert err.detail == "at most 7 instructions, got 8" and err.field == "schedule.orders"
    assert spec.validate(replace(Limits(), max_instructions=8)).ranks == 2


@pytest.mark.parametrize(
    "spec",
    [
        JobSpec(stages=4, microbatches=8, schedule="interleaved-1f1b", virtual_stages=2, name="a"),
        JobSpec(2, 2, "custom", orders=ORDERS, data_parallel=2, gpu_model="A40", blocking_power=70),
    ],
)
def test_a_stored_job_reads_back_the_same(spec: JobSpec) -> None:
    assert JobSpec.from_json(spec.to_json()) == spec


def test_an_old_document_reads_with_the_defaults() -> None:
    spec = JobSpec.from_json({"stages": 2, "microbatches": 4})
    assert spec == JobSpec(stages=2, microbatches=4)


def test_a_rank_is_stored_with_its_clocks_and_power_limit() -> None:
    rank = RankInfo("j", "j-0", 0, 0, 0, 0, "NVIDIA A40", (1740, 1410), "h", 300.0)
    assert rank.to_json() == {
        "rank_id": "j-0",
        "global_rank": 0,
        "pipeline_rank": 0,
        "data_rank": 0,
        "tensor_rank": 0,
        "gpu_name": "NVIDIA A40",
        "supported_clocks_mhz": [1740, 1410],
        "hostname": "h",
        "max_power_limit": 300.0,
    }
