"""``models/status.py``: an online profiling scan's progress, as the API publishes it.

The response model ``ProfilingStatus`` shares its name with the state enum, so the OpenAPI
document names both by their modules; that published name is why the models live here. The
scan's own document is checked against these keys in
``tests/server/decisions/test_profiling_scan.py``.
"""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from perseus_server.config import Limits
from perseus_server.domain import states
from perseus_server.models.status import ProfilingProgress, ProfilingStatus
from perseus_server.rest import create_app
from perseus_server.runtime.sql_store import SqlStore
from perseus_server.service import PerseusService

PUBLISHED = "perseus_server__models__status__ProfilingStatus"
PROGRESS = {
    "status": "running",
    "error": None,
    "frequencies": [1410, 1395],
    "step": 1,
    "current_frequency": 1395,
    "plan_version": 7,
    "warmup_iterations": 2,
    "iterations_per_frequency": 5,
    "stop_after_rises": 3,
    "measured_iterations": {"j-0-ab": 3},
    "energy_per_iteration": [{"frequency": 1410, "energy": 812.5}],
    "consecutive_rises": 0,
}


@pytest.fixture(scope="module")
def schemas() -> dict[str, Any]:
    service = PerseusService(SqlStore.open(":memory:"), Limits())
    with TestClient(create_app(service), base_url="http://localhost") as client:
        return dict(client.get("/openapi.json").json()["components"]["schemas"])


def test_the_profiling_answer_keeps_its_published_schema_name(schemas: dict[str, Any]) -> None:
    assert PUBLISHED in schemas and "ProfilingStatus" not in schemas
    assert set(schemas[PUBLISHED]["properties"]) == set(ProfilingStatus.model_fields)
    assert schemas[PUBLISHED]["properties"]["ranks"]["description"] == "Registered ranks."


def test_its_status_is_the_state_enums() -> None:
    progress = ProfilingProgress.model_validate(PROGRESS)
    assert progress.status is states.ProfilingStatus.RUNNING
    assert progress.energy_per_iteration[0].energy == 812.5
    with pytest.raises(ValidationError, match="status"):
        ProfilingProgress.model_validate({**PROGRESS, "status": "scanning"})


def test_the_answer_is_the_progress_and_the_ranks() -> None:
    assert set(ProfilingStatus.model_fields) == set(ProfilingProgress.model_fields) | {"ranks"}
    with pytest.raises(ValidationError, match="ranks"):
        ProfilingStatus.model_validate(PROGRESS)
    assert ProfilingStatus.model_validate({**PROGRESS, "ranks": 4}).ranks == 4
