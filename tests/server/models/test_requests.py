"""``models/requests.py``: the plan-selection request, one field per plan-policy parameter.

:class:`PlanSelect` is built from the policies' one table; each field takes its parameter's
bounds (an exclusive minimum as one), a number that is not finite is refused, an integer
parameter in a JSON body must be an integer, and a field no policy has is refused.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError, create_model

from perseus.policies import POLICIES
from perseus_server.models.requests import PlanSelect, policy_field
from perseus_server.service.swing import SWING_FIELDS

PUBLIC = {p.name: p for pol in POLICIES.values() for p in pol.parameters if p.public}


@pytest.mark.parametrize(
    "body",
    [
        {"eta": 1.5},  # above its maximum
        {"deadline": 0},  # its minimum is exclusive
        {"slowdown": -1.0},
        {"eta": float("nan")},
        {"index": "3"},  # an integer in a body is a JSON integer
        {"index": 2.5},
        {"etta": 0.5},  # no policy has it
    ],
)
def test_a_bad_selection_is_refused_naming_the_field(body: dict[str, object]) -> None:
    with pytest.raises(ValidationError) as e:
        PlanSelect.model_validate(body)
    assert e.value.errors()[0]["loc"][0] == next(iter(body))


def test_a_good_selection_is_taken() -> None:
    chosen = PlanSelect.model_validate({"eta": 1, "max_power": 300.0, "pipelines": [0, 2]})
    assert chosen.model_dump(exclude_none=True) == {
        "eta": 1.0,
        "max_power": 300.0,
        "pipelines": [0, 2],
    }
    assert PlanSelect.model_validate({"deadline": 1e-9}).model_dump(exclude_none=True) == {
        "deadline": 1e-9
    }


def test_a_query_parameter_takes_an_integer_written_as_text() -> None:
    index = PUBLIC["index"]
    query = create_model("Query", index=(policy_field(index, query=True)[0], None))
    assert query.model_validate({"index": "3"}).model_dump() == {"index": 3}
    _, field = policy_field(index)
    assert (field["ge"], field["le"], field["description"]) == (0, index.maximum, index.description)
    _, field = policy_field(PUBLIC["deadline"])
    assert (field["gt"], field["allow_inf_nan"]) == (0, False) and "ge" not in field


def test_plan_select_has_a_field_per_public_policy_parameter() -> None:
    # and the swing bounds, which any policy may carry (perseus_server.service.swing)
    assert set(PlanSelect.model_fields) == set(PUBLIC) | {"pipelines", *SWING_FIELDS}
