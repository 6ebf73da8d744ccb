"""The job status is sent as the service built it, without the model's validation.

The sender is ``rest.docs.built_response``. What goes on the wire must be what the model's path
would send (every key declared, the same values, the same order), also for a status with plans,
stragglers and measured power; a value that is not plain JSON still takes the model's path.
"""

from __future__ import annotations

import json
import math
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi.exceptions import ResponseValidationError

from perseus_common.proto import perseus_pb2 as pb
from perseus_common.proto import perseus_pb2_grpc as pb_grpc
from perseus_server.rest.docs import built_response
from perseus_server.rest.job_status import JobStatus, RecentIteration

from ..conftest import register, solved_job


def _through_the_model(doc: dict[str, Any]) -> Any:
    """What FastAPI sends for ``doc`` with the route's model (validated, ``exclude_unset``)."""
    return json.loads(JobStatus.model_validate(doc).model_dump_json(exclude_unset=True))


def _same(a: Any, b: Any) -> bool:
    """Equal values and, in every object, the same key order."""
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b) and type(a) in (type(b), int, float)


def test_the_status_on_the_wire_is_what_the_model_sends(
    http: httpx.Client, stub: pb_grpc.PlanServiceStub, small_csv: str
) -> None:
    job = solved_job(http, small_csv, data_parallel=2)
    ranks = [register(stub, job, g, g % 2, data_rank=g // 2).rank_id for g in range(4)]
    st = http.get(f"/jobs/{job}/status").json()
    plan = st["plan"]["pipelines"][0]
    reps = [
        pb.IterationReport(
            job_id=job, rank_id=r, iteration=i, iteration_time=plan["time"],
            plan_version=st["plan"]["version"], energy=plan["energy"] / 2, sequence=i + 1,
        )
        for r in ranks
        for i in range(3)
    ]  # fmt: skip
    assert stub.ReportIterations(iter(reps), timeout=10).accepted == 12
    reported = http.post(f"/jobs/{job}/stragglers", json={"pipeline": 1, "slowdown": 0.2})
    cleared = http.delete(f"/jobs/{job}/stragglers", params={"pipeline": 1})
    paged = http.get(f"/jobs/{job}/status", params={"ranks": 3})
    docs = []
    for r in (reported, cleared, paged):
        assert r.status_code == 200, r.text
        assert r.headers["content-type"] == "application/json"
        docs.append(r.json())
    assert docs[0]["pipelines"][1]["straggler"] is not None
    assert docs[0]["plan"]["pipelines"][0]["index"] != docs[1]["plan"]["pipelines"][0]["index"]
    assert docs[2]["measured"]["ranks"] == 4 and docs[2]["ranks_next"] == 2
    assert docs[2]["pipelines"][0]["recent_iterations"][-1]["iteration"] == 2
    for doc in docs:
        assert _same(doc, _through_the_model(doc))


def test_values_that_are_not_plain_json_take_the_models_path() -> None:
    doc = {"iteration": 3, "time": math.inf}
    assert json.loads(built_response(doc, RecentIteration).body) == {
        "iteration": 3,
        "time": None,
    }  # a non-finite float: null, as the model sends it
    r = built_response({"iteration": np.int64(3), "time": np.float64(0.5)}, RecentIteration)
    assert json.loads(r.body) == {"iteration": 3, "time": 0.5}
    with pytest.raises(ResponseValidationError, match="surprise"):
        built_response({"iteration": 3, "time": 1.0, "surprise": np.int64(1)}, RecentIteration)
