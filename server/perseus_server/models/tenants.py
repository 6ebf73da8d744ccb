"""Request and response models of the tenant routes (``/tenants``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from perseus_server.models.base import ResponseModel

__all__ = ["TenantIn", "TenantList", "TenantPatch", "TenantView"]

_MAX_JOBS = "Jobs the tenant may hold at once (null: the default, a share of the server's cap)."
_MAX_GPUS = "GPUs (the sum of its jobs' world sizes) it may hold (null: no bound of its own)."
_WEIGHT = "Its weight in the cluster power budget: the watts above the guaranteed ones are "
_WEIGHT += "shared in proportion to the weights of the tenants whose jobs draw on it."
_GUARANTEED = "Watts of the cluster power budget it is guaranteed while its jobs can use them: "
_GUARANTEED += "no other tenant's jobs push it below."


class TenantPatch(BaseModel):
    """``PATCH /tenants/{id}``: the quotas to change.

    A field left out stays; null: back to the default.
    """

    model_config = ConfigDict(extra="forbid")

    max_jobs: int | None = Field(default=None, ge=0, le=1_000_000, description=_MAX_JOBS)
    max_gpus: int | None = Field(default=None, ge=0, le=1 << 31, description=_MAX_GPUS)
    weight: float | None = Field(default=None, gt=0, le=1e6, description=_WEIGHT)
    guaranteed_watts: float | None = Field(default=None, ge=0, le=1e9, description=_GUARANTEED)


class TenantIn(TenantPatch):
    """``POST /tenants``: a new tenant and its quotas."""

    id: str = Field(
        min_length=1,
        max_length=63,
        description="Its id: the Kubernetes namespace or Slurm account (lower case, digits, "
        "``-``, ``_``, ``.``).",
    )


class TenantView(ResponseModel):
    """A tenant, its quotas and what it holds."""

    id: str = Field(description="The tenant's id (path parameter ``tenant_id``).")
    created: float = Field(description="When it was created (Unix time, s).")
    max_jobs: int = Field(description="Its job quota in force.")
    max_gpus: int | None = Field(description=_MAX_GPUS)
    weight: float = Field(description=_WEIGHT)
    guaranteed_watts: float = Field(description=_GUARANTEED)
    jobs: int = Field(description="Jobs it holds.")
    gpus: int = Field(description="GPUs its jobs hold (their world sizes).")


class TenantList(ResponseModel):
    """The tenants (a tenant's credential sees its own only)."""

    tenants: list[TenantView]
