"""``models/base.py``'s :class:`JsonView`: a value of ours in a response model.

A view lets a response model hold the value class itself (one class for a plan step in every
package) while its JSON keys stay what the API publishes; one that leaves a field of the value
unnamed is refused when the model is built. How the plan routes' ``PlanStep`` view reads and
writes is ``test_responses.py``'s.
"""

from __future__ import annotations

from typing import Annotated

import pytest
from pydantic import BaseModel

from perseus_common.wire.values import ProfilingTask
from perseus_server.models.base import JsonKey, JsonView


def test_a_view_names_every_field_of_the_value_once() -> None:
    partial = JsonView("A profiling task.", clock=JsonKey("frequency_mhz"))

    with pytest.raises(TypeError, match="ProfilingTask: JSON keys for"):

        class Model(BaseModel):  # refused when the model is built
            task: Annotated[ProfilingTask, partial]
