"""``/tenants``: teams sharing the server, their quotas and budget shares.

See :mod:`perseus_server.service.tenants`. The admin alone creates, changes and deletes them; a
tenant's own credentials read only their tenant (the table of
:mod:`perseus_server.service.authorization`, enforced by the Gate).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response

from perseus_server.models.tenants import TenantIn, TenantList, TenantPatch, TenantView
from perseus_server.rest.docs import operation
from perseus_server.rest.gate import CALLER
from perseus_server.service import PerseusService
from perseus_server.service.authorization import sees_tenant
from perseus_server.service.credentials import Principal

__all__ = ["TAG", "tenants_router"]

TAG = {
    "name": "tenants",
    "description": "Teams sharing the server: their credentials, quotas and budget shares.",
}


def tenants_router(service: PerseusService) -> APIRouter:
    """The tenant routes over ``service``'s tenants."""
    router = APIRouter(tags=["tenants"])
    tenants = service.tenants

    @router.post(
        "/tenants",
        **operation(TenantView, "Create a tenant", "The new tenant.", 409, 413, 422, status=201),
    )
    async def create_tenant(body: TenantIn) -> dict[str, Any]:
        """A tenant with its quotas; issue its credentials with ``POST /credentials``.

        A tenant is a team: a Kubernetes namespace, a Slurm account. 409 when it exists.
        """
        return tenants.create(body.id, body.model_dump(exclude={"id"}, exclude_unset=True))

    @router.get("/tenants", **operation(TenantList, "List tenants", "The tenants."))
    async def list_tenants(who: Principal = CALLER) -> dict[str, Any]:
        """Every tenant, its quotas and what it holds (a tenant's credential: its own)."""
        return {"tenants": tenants.listing(sees_tenant(who))}

    @router.get("/tenants/{tenant_id}", **operation(TenantView, "Get a tenant", "The tenant.", 404))
    async def get_tenant(tenant_id: str) -> dict[str, Any]:
        """A tenant's quotas, weight, guaranteed watts, jobs and GPUs."""
        return tenants.view(tenant_id)

    @router.patch(
        "/tenants/{tenant_id}",
        **operation(TenantView, "Change a tenant's quotas", "The tenant.", 404, 413, 422),
    )
    async def patch_tenant(tenant_id: str, body: TenantPatch) -> dict[str, Any]:
        """The quotas given change (null: back to the default).

        A new weight or guarantee re-shares the cluster power budget at once. Jobs it holds
        beyond a lowered quota stay.
        """
        out = tenants.patch(tenant_id, body.model_dump(exclude_unset=True))
        service.power_budget.recompute(f"tenant {tenant_id} changed")
        return out

    @router.delete(
        "/tenants/{tenant_id}",
        response_class=Response,
        **operation(None, "Delete a tenant", "Deleted.", 404, 409, status=204),
    )
    async def delete_tenant(tenant_id: str) -> Response:
        """Deletes the tenant and its credentials.

        409 while it holds jobs, and for the ``default`` tenant.
        """
        tenants.delete(tenant_id)
        return Response(status_code=204)

    return router
