"""A value of ours in a response model: the wire's ``PlanStep`` as ``GET /jobs/{id}/plan`` sends it.

:class:`~perseus_server.models.base.JsonView` lets a response model hold the value class itself
(one class for a plan step in every package) while its JSON keys, their order, descriptions and
schema stay what the API publishes: validation builds the wire's ``PlanStep``, serialisation
writes what :func:`perseus.frontier.plan_json` writes, byte for byte.
"""

from __future__ import annotations

import json
from typing import Annotated

import pytest
from pydantic import BaseModel, TypeAdapter, ValidationError

from perseus.frontier import plan_json
from perseus_common.wire.values import PlanStep, ProfilingTask
from perseus_server.models.base import JsonKey, JsonView
from perseus_server.models.responses import PlanDoc, PlanStepJson

PLAN = [
    [PlanStep("forward", 0, 1410, 0), PlanStep("backward_input", 0, 1200, 2)],
    [PlanStep("forward", 1, 990, 1)],
]
STEPS = TypeAdapter(list[list[PlanStepJson]])


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


def test_a_view_names_every_field_of_the_value_once() -> None:
    partial = JsonView("A profiling task.", clock=JsonKey("frequency_mhz"))

    with pytest.raises(TypeError, match="ProfilingTask: JSON keys for"):

        class Model(BaseModel):  # refused when the model is built
            task: Annotated[ProfilingTask, partial]
