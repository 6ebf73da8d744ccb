"""Physical bounds on reports, the same on every path.

A report outside them is refused naming the field, and nothing the server derives from the ones it
takes (a straggler's time, a slow-stage factor, a power budget's lowest power, the status) becomes
non-finite; ``PUT /power-budget`` never answers 500. A property test over the report fields, on a
real server fed over real gRPC streams.
"""

from __future__ import annotations

import itertools
import json
import math
from typing import Any

import grpc
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from perseus_common.proto import perseus_pb2 as pb
from perseus_common.proto import perseus_pb2_grpc as pb_grpc
from perseus_server.domain.bounds import (
    MAX_ENERGY,
    MAX_INSTRUCTION_SECONDS,
    MAX_SECONDS,
    MAX_STAGE_FACTOR,
    MIN_SECONDS,
    bounded_factor,
)

from ..conftest import register, solved_job

EDGES = [5e-324, 1e-300, 1e-7, MIN_SECONDS, 0.01, 0.5, 3.0, 1e5, MAX_SECONDS, 1.000001e6]
EDGES += [1e10, 1.0000001e10, 1e300, 1e308, math.inf, -1.0, 0.0, math.nan]
FLOATS = st.one_of(st.sampled_from(EDGES), st.floats(allow_nan=True, allow_infinity=True))


def _strict(text: str) -> Any:
    """JSON without the non-standard Infinity and NaN (what a browser's parser accepts)."""

    def refuse(name: str) -> None:
        raise AssertionError(f"non-finite number {name} in {text[:200]}")

    return json.loads(text, parse_constant=refuse)


def _finite_numbers(doc: Any, where: str = "") -> None:
    if isinstance(doc, float):
        assert math.isfinite(doc), where
    elif isinstance(doc, dict):
        for k, v in doc.items():
            _finite_numbers(v, f"{where}.{k}")
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            _finite_numbers(v, f"{where}[{i}]")


@pytest.fixture(scope="module")
def job(http: httpx.Client, stub: pb_grpc.PlanServiceStub, small_csv: str) -> dict[str, Any]:
    job_id = solved_job(http, small_csv, data_parallel=2)
    ranks = {
        (d, s): register(stub, job_id, d * 2 + s, s, data_rank=d).rank_id
        for d in (0, 1)
        for s in (0, 1)
    }
    body = {"threshold": 0.01, "consecutive": 1, "recovery": 0.0}
    assert http.put(f"/jobs/{job_id}/straggler-detection", json=body).status_code == 200
    return {"id": job_id, "ranks": ranks, "seq": itertools.count(1), "it": itertools.count(1)}


def _expected_field(it_time: float, energy: float, m_time: float, m_energy: float) -> str | None:
    def ok(x: float, lo: float, hi: float) -> bool:
        return math.isfinite(x) and lo <= x <= hi

    if not ok(it_time, MIN_SECONDS, MAX_SECONDS):
        return "iteration_time"
    if not ok(energy, 0.0, MAX_ENERGY):
        return "energy"
    if not (ok(m_time, 0.0, MAX_INSTRUCTION_SECONDS) and m_time > 0):
        return "instructions.time"
    if not ok(m_energy, 0.0, MAX_ENERGY):
        return "instructions.energy"
    return None


@pytest.mark.slow
@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    it_time=FLOATS, energy=FLOATS, m_time=FLOATS, m_energy=FLOATS, pipeline=st.sampled_from([0, 1])
)
def test_no_report_makes_a_derived_figure_non_finite(
    http: httpx.Client,
    stub: pb_grpc.PlanServiceStub,
    job: dict[str, Any],
    small_freqs: list[int],
    it_time: float,
    energy: float,
    m_time: float,
    m_energy: float,
    pipeline: int,
) -> None:
    version = http.get(f"/jobs/{job['id']}/status").json()["plan"]["version"]
    it = next(job["it"])
    measured = [
        pb.InstructionMeasurement(
            instruction=kind, microbatch=mb, frequency_mhz=small_freqs[0], time=m_time,
            energy=m_energy, stage=0,
        )
        for kind in ("forward", "backward")
        for mb in range(4)
    ]  # fmt: skip
    report = pb.IterationReport(
        job_id=job["id"], rank_id=job["ranks"][(pipeline, 0)], iteration=it,
        iteration_time=it_time, plan_version=version, energy=energy, sequence=next(job["seq"]),
        instructions=measured,
    )  # fmt: skip
    want = _expected_field(it_time, energy, m_time, m_energy)
    if want is None:
        ack = stub.ReportIterations(iter([report]), timeout=30)
        assert ack.accepted == 1
    else:
        with pytest.raises(grpc.RpcError) as e:
            stub.ReportIterations(iter([report]), timeout=30)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert e.value.details().startswith(want + ":"), e.value.details()
    status = http.get(f"/jobs/{job['id']}/status")
    assert status.status_code == 200
    doc = _strict(status.text)
    _finite_numbers(doc)
    for p in doc["pipelines"]:
        if p["straggler"] is not None:
            assert p["straggler"]["time"] <= MAX_SECONDS
        for f in (p["slow_stages"] or {}).get("factors", {}).values():
            assert 1 / MAX_STAGE_FACTOR <= f <= MAX_STAGE_FACTOR
    for watts in (1.0, 1e6):
        r = http.put("/power-budget", json={"watts": watts, "jobs": [job["id"]]})
        assert r.status_code in (200, 422), r.text
        _finite_numbers(_strict(r.text))
    r = http.get("/power-budget")
    assert r.status_code in (200, 404), r.text
    _finite_numbers(_strict(r.text))
    assert http.delete("/power-budget").status_code in (200, 204)


def test_rest_straggler_times_have_the_same_bounds(http: httpx.Client, job: dict[str, Any]) -> None:
    for bad in (1e308, MAX_SECONDS * 1.01):
        r = http.post(f"/jobs/{job['id']}/stragglers", json={"pipeline": 0, "iteration_time": bad})
        assert r.status_code == 422 and r.json()["field"] == "iteration_time", r.text


def test_factors_are_clamped() -> None:
    assert bounded_factor(2e301) == MAX_STAGE_FACTOR
    assert bounded_factor(1e-300) == 1 / MAX_STAGE_FACTOR
    assert bounded_factor(math.nan) == 1.0
    assert bounded_factor(1.5) == 1.5
