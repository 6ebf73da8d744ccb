"""The plan-selection request models (``PUT /jobs/{id}/plan``, ``GET /jobs/{id}/plan``).

The plan policies come from their one table (:data:`perseus.policies.POLICIES`):
:class:`PlanSelect`'s fields are built from it at import (type checkers see a plain model;
``tests/server/models/test_requests.py`` checks the built ones). The other features' request
models sit next to their routers in :mod:`perseus_server.rest`; these stay here while
:mod:`perseus_server.rest.plans` imports them from here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, create_model

from perseus.policies import POLICIES, Parameter
from perseus_server.models.base import Index

__all__ = ["PlanSelect", "policy_field"]


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
    return (float if query else StrictFloat) | None, dict(
        bounds, allow_inf_nan=False, description=p.description
    )


if TYPE_CHECKING:
    _PolicyFields = BaseModel
else:
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
    max_swing: StrictFloat | None = Field(
        default=None,
        description="Bound the job's power swing, 1 - trough / peak (0-1): every rank is sent "
        "the power floors that keep the deployed plan within it (docs/power.md).",
    )
    max_ramp: StrictFloat | None = Field(
        default=None,
        description="Bound every change within ramp_window as a fraction of the peak (0-1).",
    )
    ramp_window: StrictFloat | None = Field(default=None, description="Seconds (default 0.1).")
