"""``/tenants``: teams sharing the server, their quotas and budget shares.

See :mod:`perseus_server.service.tenants`. The admin alone creates, changes and deletes them; a
tenant's own credentials read only their tenant (the table of
:mod:`perseus_server.service.authorization`, enforced by the Gate).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt

from perseus_server.models.base import ResponseModel
from perseus_server.rest.docs import operation
from perseus_server.rest.gate import CALLER
from perseus_server.service import PerseusService
from perseus_server.service.authorization import ADMIN_ONLY, JOB_READ, allow, sees_tenant
from perseus_server.service.credentials import Principal

__all__ = ["TAG", "TenantIn", "TenantList", "TenantPatch", "TenantView", "tenants_router"]

TAG = {
    "name": "tenants",
    "description": "Teams sharing the server: their credentials, quotas and budget shares.",
}


# --- models ---------------------------------------------------------------------------------------

_MAX_JOBS = "Jobs the tenant may hold at once (null: the default, an equal part of what the "
_MAX_JOBS += "explicit quotas leave of the server's max_jobs, at most tenant_job_share of it)."

_MAX_GPUS = "GPUs (the sum of its jobs' world sizes) it may hold (null: the default, an equal "
_MAX_GPUS += "part of what the explicit quotas leave of the server's max_gpus, as for jobs)."

_WEIGHT = "Its weight in the cluster power budget: the watts above the guaranteed ones are "
_WEIGHT += "shared in proportion to the weights of the tenants whose jobs draw on it."

_GUARANTEED = "Watts of the cluster power budget it is guaranteed while its jobs can use them: "
_GUARANTEED += "no other tenant's jobs push it below."


class TenantPatch(BaseModel):
    """``PATCH /tenants/{id}``: the quotas to change.

    A field left out stays; null: back to the default.
    """

    model_config = ConfigDict(extra="forbid")

    max_jobs: StrictInt | None = Field(default=None, ge=0, le=1_000_000, description=_MAX_JOBS)
    max_gpus: StrictInt | None = Field(default=None, ge=0, le=1 << 31, description=_MAX_GPUS)
    weight: StrictFloat | None = Field(default=None, gt=0, le=1e6, description=_WEIGHT)
    guaranteed_watts: StrictFloat | None = Field(
        default=None, ge=0, le=1e9, description=_GUARANTEED
    )


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
    max_gpus: int = Field(description="Its GPU quota in force.")
    weight: float = Field(description=_WEIGHT)
    guaranteed_watts: float = Field(description=_GUARANTEED)
    jobs: int = Field(description="Jobs it holds.")
    gpus: int = Field(description="GPUs its jobs hold (their world sizes).")


class TenantList(ResponseModel):
    """The tenants (a tenant's credential sees its own only)."""

    tenants: list[TenantView]


def tenants_router(service: PerseusService) -> APIRouter:
    """The tenant routes over ``service``'s tenants."""
    router = APIRouter(tags=["tenants"])

    @router.post(
        "/tenants",
        **operation(TenantView, "Create a tenant", "The new tenant.", 409, 413, 422, status=201),
    )
    @allow(ADMIN_ONLY)
    async def create_tenant(body: TenantIn) -> dict[str, Any]:
        """A tenant with its quotas; issue its credentials with ``POST /credentials``.

        A tenant is a team: a Kubernetes namespace, a Slurm account. 409 when it exists, or
        when the server's caps cannot reserve every tenant's quota with it (field
        ``max_jobs`` or ``max_gpus``).
        """
        return service.create_tenant(body.id, body.model_dump(exclude={"id"}, exclude_unset=True))

    @router.get("/tenants", **operation(TenantList, "List tenants", "The tenants."))
    @allow(JOB_READ)
    async def list_tenants(who: Principal = CALLER) -> dict[str, Any]:
        """Every tenant, its quotas and what it holds (a tenant's credential: its own)."""
        return {"tenants": service.tenant_listing(sees_tenant(who))}

    @router.get("/tenants/{tenant_id}", **operation(TenantView, "Get a tenant", "The tenant.", 404))
    @allow(JOB_READ)
    async def get_tenant(tenant_id: str) -> dict[str, Any]:
        """A tenant's quotas, weight, guaranteed watts, jobs and GPUs."""
        return service.tenant(tenant_id)

    @router.patch(
        "/tenants/{tenant_id}",
        **operation(TenantView, "Change a tenant's quotas", "The tenant.", 404, 409, 413, 422),
    )
    @allow(ADMIN_ONLY)
    async def patch_tenant(tenant_id: str, body: TenantPatch) -> dict[str, Any]:
        """The quotas given change (null: back to the default).

        A new weight or guarantee re-shares the cluster power budget at once. Jobs it holds
        beyond a lowered quota stay. A quota the server's caps cannot reserve (with every
        other tenant's) is refused with 409 naming it.
        """
        return service.patch_tenant(tenant_id, body.model_dump(exclude_unset=True))

    @router.delete(
        "/tenants/{tenant_id}",
        response_class=Response,
        **operation(None, "Delete a tenant", "Deleted.", 404, 409, status=204),
    )
    @allow(ADMIN_ONLY)
    async def delete_tenant(tenant_id: str) -> Response:
        """Deletes the tenant and its credentials.

        409 while it holds jobs, and for the ``default`` tenant.
        """
        service.delete_tenant(tenant_id)
        return Response(status_code=204)

    return router
