"""``models/responses.py``: the frontier, plan and deployment bodies the plan routes answer.

A plan's steps are the wire's ``PlanStep`` values, validated into and written from the JSON
``GET /jobs/{id}/plan`` publishes, byte for byte as :func:`perseus.frontier.plan_json` writes it
(the :class:`~perseus_server.models.base.JsonView` behind them is tested in
``test_base_json_view.py``); a deployment is read by its ``kind``.
"""

from __future__ import annotations

import json

import pytest
from pydantic import TypeAdapter, ValidationError

from perseus.frontier import plan_json
from perseus_common.wire.values import PlanStep
from perseus_server.models.responses import (
    DeploymentView,
    MaxClockDeployment,
    PlanDoc,
    PlanStepJson,
    ProfilingDeployment,
)

PLAN = [
    [PlanStep("forward", 0, 1410, 0), PlanStep("backward_input", 0, 1200, 2)],
    [PlanStep("forward", 1, 990, 1)],
]
STEPS = TypeAdapter(list[list[PlanStepJson]])
DEPLOYMENT = TypeAdapter(DeploymentView)
POLICY = {"kind": "eta", "value": 0.5}


def test_a_deployment_is_read_by_its_kind() -> None:
    base = {"version": 3, "reason": "r", "deployed_at": 1.0, "policy": POLICY}
    clock = DEPLOYMENT.validate_python({**base, "kind": "max_clock", "frequency": 1410})
    assert isinstance(clock, MaxClockDeployment) and clock.frequency == 1410
    step = {"frequency": 990, "warmup_iterations": 2, "iterations": 5}
    scan = DEPLOYMENT.validate_python({**base, "kind": "profiling", "profiling": step})
    assert isinstance(scan, ProfilingDeployment) and scan.profiling.iterations == 5
    with pytest.raises(ValidationError, match="kind"):
        DEPLOYMENT.validate_python({**base, "kind": "overclock", "frequency": 1410})


def test_the_json_of_a_plan_validates_into_the_wires_steps_and_back() -> None:
    doc = plan_json(PLAN)
    steps = STEPS.validate_python(doc)
    assert steps == PLAN and all(type(s) is PlanStep for rank in steps for s in rank)
    # Serialised, it is what the service sends: the same keys in the same order.
    assert STEPS.dump_json(steps) == json.dumps(doc, separators=(",", ":")).encode()


def test_the_json_keys_are_checked_as_a_response_models_are() -> None:
    good = {"instruction": "forward", "microbatch": 0, "stage": 0, "frequency": 1410}
    with pytest.raises(ValidationError, match="frequency"):  # the wire's name is not the key
        STEPS.validate_python([[{**good, "frequency_mhz": 1410, "frequency": None}]])
    with pytest.raises(ValidationError, match=r"clock\n  Unexpected keyword"):
        STEPS.validate_python([[{**good, "clock": 1}]])
    missing = {k: v for k, v in good.items() if k != "stage"}  # stage has a default on the wire
    with pytest.raises(ValidationError, match="stage"):
        STEPS.validate_python([[missing]])


def test_the_plan_document_publishes_the_step_schema() -> None:
    schema = PlanDoc.model_json_schema(mode="serialization", ref_template="{model}")
    step = schema["$defs"]["PlanStep"]
    assert list(step["properties"]) == ["instruction", "microbatch", "stage", "frequency"]
    assert step["required"] == ["instruction", "microbatch", "stage", "frequency"]
    assert step["additionalProperties"] is False
    assert step["description"] == "One instruction of a rank's plan."
    assert "MHz" in step["properties"]["frequency"]["description"]
    assert step["properties"]["frequency"]["title"] == "Frequency"
    items = schema["properties"]["steps"]["items"]["items"]
    assert items == {"$ref": "PlanStep"}
