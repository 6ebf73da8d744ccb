"""Credential routes: a job's rank credential, and read and tenant credentials.

A job's rank credential (rotate, revoke), read and tenant credentials (issue, list, revoke), and the
issuing of a job's rank credential when it is created (:func:`create_job_with_credential`). Who may
call each: the table of :mod:`perseus_server.service.authorization`, which the Gate enforces.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from perseus_server.domain.errors import BadRequest, NotFound
from perseus_server.domain.jobs import JobSpec
from perseus_server.models.base import ResponseModel, omitted
from perseus_server.rest.docs import operation
from perseus_server.rest.gate import CALLER
from perseus_server.service import PerseusService
from perseus_server.service.authorization import sees_tenant
from perseus_server.service.credentials import Credentials, Principal, Scope

__all__ = [
    "TAG",
    "CredentialIn",
    "CredentialList",
    "CredentialView",
    "IssuedCredentialView",
    "create_job_with_credential",
    "credentials_router",
]

TAG = {
    "name": "credentials",
    "description": "Scoped credentials: read-only ones for monitoring, rank ones per job.",
}


# --- models ---------------------------------------------------------------------------------------

_SCOPE = "``read`` (the cluster's monitoring: reads every tenant's jobs), ``tenant`` (its "
_SCOPE += "tenant's jobs), ``tenant-read`` (reads its tenant's jobs), ``rank`` (its job's "
_SCOPE += "gRPC calls as its ranks, and its status) or ``zeus`` (its tenant's Zeus runs, in the "
_SCOPE += "URL ``/zeus/<credential>/``)."
_Scope = Literal["read", "tenant", "tenant-read", "rank", "zeus"]


class CredentialIn(BaseModel):
    """The credential to issue."""

    model_config = ConfigDict(extra="forbid")

    scope: Literal["read", "tenant", "tenant-read", "zeus"] = Field(
        description="``read``: reads every tenant's jobs (monitoring, the operator's page); "
        "``tenant``: creates jobs in ``tenant`` and reads and changes only those; "
        "``tenant-read``: reads ``tenant``'s jobs only; ``zeus``: ``tenant``'s Zeus runs "
        "only, given in the Zeus client's server URL (``http://HOST:PORT/zeus/<credential>``)."
    )
    tenant: str | None = Field(
        default=None, max_length=63, description="The tenant of a tenant credential."
    )


class IssuedCredentialView(ResponseModel):
    """A credential just issued or rotated: its secret is shown this once."""

    id: str = Field(description="The credential's ID (path parameter ``credential_id``).")
    scope: _Scope = Field(description=_SCOPE)
    job_id: str = omitted("Rank credentials: their job.")
    tenant: str = omitted("Tenant credentials: their tenant.")
    credential: str = Field(description="The secret: send it as ``Authorization: Bearer ...``.")
    created: float = Field(description="When it was first issued (Unix time, s).")


class CredentialView(ResponseModel):
    """An issued credential, without its secret."""

    id: str = Field(description="The credential's ID (path parameter ``credential_id``).")
    scope: _Scope = Field(description=_SCOPE)
    job_id: str = omitted("Rank credentials: their job.")
    tenant: str = omitted("Tenant credentials: their tenant.")
    created: float = Field(description="When it was first issued (Unix time, s).")
    rotated: float | None = Field(description="When its secret was last replaced, or null.")
    revoked: float | None = Field(description="When it was revoked, or null (in force).")


class CredentialList(ResponseModel):
    """Every issued credential (the configured admin and read tokens are not listed)."""

    credentials: list[CredentialView]


def create_job_with_credential(
    service: PerseusService, credentials: Credentials, spec: JobSpec, tenant: str
) -> dict[str, Any]:
    """``POST /jobs``: the job of ``tenant`` and, when a token is configured, its rank credential.

    Both are stored in one transaction (the secret is in the answer only).
    """
    if not credentials.enabled:
        return service.create_job(spec, tenant)
    with service.store.transaction():
        view = service.create_job(spec, tenant)
        issued = credentials.issue(Scope.RANK, str(view["id"]))
    return {**view, "rank_credential": issued.secret}


def credentials_router(service: PerseusService, credentials: Credentials) -> APIRouter:
    """The credential routes over ``service``'s jobs and ``credentials``."""
    router = APIRouter(tags=["credentials"])

    @router.post(
        "/jobs/{job_id}/credentials/rotate",
        **operation(
            IssuedCredentialView, "Rotate a job's rank credential", "The new credential.", 404
        ),
    )
    async def rotate_rank_credential(job_id: str) -> dict[str, Any]:
        """A new secret for the job's rank credential.

        It is issued if the job has none, and in force again if it was revoked. The old
        secret stops working at once; the rank identities registered with the credential
        stay bound to it. The secret is shown only here.
        """
        service.jobs.get(job_id)
        return credentials.rotate_rank(job_id).to_json()

    @router.delete(
        "/jobs/{job_id}/credentials",
        response_class=Response,
        **operation(None, "Revoke a job's rank credential", "Revoked.", 404, status=204),
    )
    async def revoke_rank_credential(job_id: str) -> Response:
        """The job's rank credential stops working until it is rotated.

        Its ranks' calls are refused; 404 when the job has none in force.
        """
        service.jobs.get(job_id)
        if not credentials.revoke_rank(job_id):
            raise NotFound(f"job {job_id} has no rank credential in force", field="job_id")
        return Response(status_code=204)

    @router.post(
        "/credentials",
        **operation(
            IssuedCredentialView, "Issue a credential", "The new credential.", 422, status=201
        ),
    )
    async def issue_credential(body: CredentialIn) -> dict[str, Any]:
        """A cluster read credential, or a tenant's credential naming the tenant.

        A read credential is for monitoring and the operator's page; a tenant's credential
        is ``tenant`` (its jobs), ``tenant-read`` (reading them) or ``zeus`` (its Zeus runs,
        the credential in the Zeus client's URL). The secret is shown only
        here; the server keeps its SHA-256.
        """
        scope = Scope(body.scope)
        if scope is Scope.READ:
            if body.tenant is not None:
                raise BadRequest(
                    "a read credential reads every tenant; for one tenant's, give scope "
                    "'tenant-read'",
                    field="tenant",
                )
            return credentials.issue(scope).to_json()
        if body.tenant is None:
            raise BadRequest(f"a {scope} credential names its tenant", field="tenant")
        if body.tenant not in service.tenants:
            raise BadRequest(f"no tenant {body.tenant!r}; POST /tenants first", field="tenant")
        return credentials.issue(scope, tenant=body.tenant).to_json()

    @router.get(
        "/credentials",
        **operation(CredentialList, "List credentials", "The issued credentials, without secrets."),
    )
    async def list_credentials(who: Principal = CALLER) -> dict[str, Any]:
        """Every issued credential (read, tenant and rank); secrets are never shown again.

        For each: id, scope, job or tenant, when it was issued, rotated and revoked (a
        tenant's credential: its tenant's and its jobs').
        """
        tenant = sees_tenant(who)
        if tenant is None:
            return {"credentials": credentials.listing()}
        mine = service.tenant_of
        return {"credentials": credentials.tenant_listing(tenant, lambda job: mine(job) == tenant)}

    @router.delete(
        "/credentials/{credential_id}",
        response_class=Response,
        **operation(None, "Revoke a credential", "Revoked.", 404, status=204),
    )
    async def revoke_credential(credential_id: str) -> Response:
        """The credential stops working at once (404 when unknown or revoked already)."""
        if not credentials.revoke(credential_id):
            raise NotFound(f"no credential {credential_id!r} in force", field="credential_id")
        return Response(status_code=204)

    return router
