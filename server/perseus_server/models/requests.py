"""Pydantic models of the REST API's request bodies (the API boundary only).

The schedule names and the plan policies come from their one table each
(:data:`perseus.schedules.SCHEDULE_NAMES`, :data:`perseus.policies.POLICIES`): the Literals and
:class:`PlanSelect`'s fields are built from them at import (type checkers see ``str`` and a plain
model; ``tests/server/test_vocabulary.py`` checks the built ones).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, create_model

from perseus.policies import POLICIES, Parameter
from perseus.schedules import SCHEDULE_NAMES
from perseus_common.clocks import MAX_CLOCK_MHZ

__all__ = [
    "INT32_MAX",
    "MAX_CLOCK_MHZ",
    "JobIn",
    "ScheduleIn",
    "PlanSelect",
    "ScheduleName",
    "policy_field",
    "ProfilingIn",
    "StragglerIn",
    "DetectionIn",
]

#: Largest value of an int32 wire field: indices beyond it could not travel to a rank.
INT32_MAX = 2**31 - 1

Count = Annotated[StrictInt, Field(ge=1, le=1_000_000)]
Watts = Annotated[float, Field(ge=0, le=10_000, allow_inf_nan=False)]
Index = Annotated[StrictInt, Field(ge=0, le=INT32_MAX)]
Clock = Annotated[StrictInt, Field(ge=1, le=MAX_CLOCK_MHZ)]
OrderOp = tuple[Annotated[str, Field(max_length=64)], Index, Index]


def policy_field(p: Parameter, *, query: bool = False) -> tuple[Any, dict[str, Any]]:
    """``(type, Field keywords)`` of a policy parameter as an optional request field.

    With ``query``, a ``fastapi.Query`` parameter instead, whose integers arrive as text. Its
    bounds and description come from the registry.
    """
    bounds: dict[str, Any] = {}
    if p.minimum is not None:
        bounds["gt" if p.exclusive_minimum else "ge"] = p.minimum
    if p.maximum is not None:
        bounds["le"] = p.maximum
    if p.integer:
        return (int if query else StrictInt) | None, dict(bounds, description=p.description)
    return float | None, dict(bounds, allow_inf_nan=False, description=p.description)


if TYPE_CHECKING:
    ScheduleName = str
    _PolicyFields = BaseModel
else:
    #: A built-in schedule's name.
    ScheduleName = Literal[SCHEDULE_NAMES]
    _PolicyFields = create_model(
        "_PolicyFields",
        __config__=ConfigDict(extra="forbid"),
        **{
            p.name: (t, Field(default=None, **kw))
            for pol in POLICIES.values()
            for p in pol.parameters
            if p.public
            for t, kw in [policy_field(p)]
        },
    )


class ScheduleIn(BaseModel):
    """A named schedule, or an explicit per-rank order (``name: custom`` with ``orders``)."""

    model_config = ConfigDict(extra="forbid")
    name: ScheduleName | Literal["custom"] = "1f1b"
    virtual_stages: Annotated[StrictInt, Field(ge=1, le=1024)] = 1
    orders: list[list[OrderOp]] | None = Field(
        default=None,
        description="Per rank, the ops it runs in order: [instruction, microbatch, stage].",
    )


class JobIn(BaseModel):
    """``POST /jobs``."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(default="", max_length=200)
    tenant: str | None = Field(
        default=None,
        max_length=63,
        description="The tenant the job belongs to. The admin may name any (default: "
        "``default``); a tenant credential's jobs are its tenant's (naming another is refused).",
    )
    stages: Count = Field(description="Pipeline ranks per pipeline.")
    microbatches: Count
    schedule: ScheduleIn | ScheduleName = "1f1b"
    virtual_stages: Annotated[StrictInt, Field(ge=1, le=1024)] | None = None
    data_parallel: Count = 1
    tensor_parallel: Count = 1
    gpu_model: str = Field(default="", max_length=200)
    blocking_power: Watts | None = Field(
        default=None,
        description="Watts a GPU draws while waiting on a pipeline neighbour. Omitted: the "
        "table's value for a known ``gpu_model`` (A100, A40); for a ``gpu_model`` the table does "
        "not know it must be given (measure it: the GPU's power draw during a blocking receive, "
        "e.g. ``nvidia-smi --query-gpu=power.draw``, or run online profiling, which measures "
        "it); 0 when neither is given.",
    )


class PlanSelect(_PolicyFields):
    """``PUT /jobs/{id}/plan``: at most one policy (none: the fastest plan) and its options.

    One field per parameter of :data:`perseus.policies.POLICIES`.
    """

    model_config = ConfigDict(extra="forbid")
    pipelines: list[Index] | None = Field(
        default=None,
        max_length=1_000_000,
        description="Deploy only to these data-parallel pipelines (default: all, as the new default).",
    )


class ProfilingIn(BaseModel):
    """``POST /jobs/{id}/profiling``."""

    model_config = ConfigDict(extra="forbid")
    frequencies: list[Clock] | None = Field(
        default=None,
        max_length=1024,
        description="Clocks to scan (MHz); default: every clock all registered ranks support.",
    )
    warmup_iterations: Annotated[StrictInt, Field(ge=0, le=1000)] = Field(
        default=2, description="Iterations at each new clock that are not measured."
    )
    iterations_per_frequency: Annotated[StrictInt, Field(ge=1, le=1000)] = Field(
        default=5,
        description="The most measured iterations per rank at a clock (fewer once every "
        "instruction's mean time and energy are known within ``tolerance``).",
    )
    stop_after_rises: Annotated[StrictInt, Field(ge=1, le=1000)] = Field(
        default=3,
        description="Per instruction: how many clocks in a row its effective cost must rise "
        "beyond the noise, after its lowest point, before the scan may stop.",
    )
    tolerance: Annotated[float, Field(ge=0, le=0.5, allow_inf_nan=False)] = Field(
        default=0.01,
        description="Relative standard error at which a clock's means are known: a clock is "
        "finished once every instruction's mean time and energy are known within it (from at "
        "least two samples), else after ``iterations_per_frequency``. 0: always measure "
        "``iterations_per_frequency`` iterations and do not measure the fastest clocks again "
        "after the scan.",
    )


class StragglerIn(BaseModel):
    """``POST /jobs/{id}/stragglers``: a pipeline known to be slow."""

    model_config = ConfigDict(extra="forbid")
    pipeline: Index
    slowdown: Annotated[float, Field(gt=0, le=100, allow_inf_nan=False)] | None = None
    iteration_time: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None


class DetectionIn(BaseModel):
    """``PUT /jobs/{id}/straggler-detection``."""

    model_config = ConfigDict(extra="forbid")
    threshold: Annotated[float, Field(gt=0, le=10, allow_inf_nan=False)] = 0.05
    consecutive: Annotated[StrictInt, Field(ge=1, le=1000)] = 3
    recovery: Annotated[float, Field(ge=0, le=10, allow_inf_nan=False)] = 0.02
