"""Credential routes: a job's rank credential, and read and tenant credentials.

A job's rank credential (rotate, revoke), read and tenant credentials (issue, list, revoke); a
job's rank credential is issued when it is created (:meth:`PerseusService.create_job`). Who may
call each: the table of :mod:`perseus_server.service.authorization`, which the Gate enforces.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from perseus_server.models.base import ResponseModel, omitted
from perseus_server.rest.docs import operation
from perseus_server.rest.gate import CALLER
from perseus_server.service import PerseusService
from perseus_server.service.authorization import ADMIN_ONLY, JOB_READ, JOB_WRITE, allow, sees_tenant
from perseus_server.service.credentials import Credentials, Principal, Scope

__all__ = [
    "TAG",
    "CredentialIn",
    "CredentialList",
    "CredentialView",
    "IssuedCredentialView",
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


def credentials_router(service: PerseusService, credentials: Credentials) -> APIRouter:
    """The credential routes over ``service``'s jobs and ``credentials``."""
    router = APIRouter(tags=["credentials"])

    @router.post(
        "/jobs/{job_id}/credentials/rotate",
        **operation(
            IssuedCredentialView, "Rotate a job's rank credential", "The new credential.", 404
        ),
    )
    @allow(JOB_WRITE)
    async def rotate_rank_credential(job_id: str) -> dict[str, Any]:
        """A new secret for the job's rank credential.

        It is issued if the job has none, and in force again if it was revoked. The old
        secret stops working at once; the rank identities registered with the credential
        stay bound to it. The secret is shown only here.
        """
        return service.rotate_rank_credential(credentials, job_id)

    @router.delete(
        "/jobs/{job_id}/credentials",
        response_class=Response,
        **operation(None, "Revoke a job's rank credential", "Revoked.", 404, status=204),
    )
    @allow(JOB_WRITE)
    async def revoke_rank_credential(job_id: str) -> Response:
        """The job's rank credential stops working until it is rotated.

        Its ranks' calls are refused; 404 when the job has none in force.
        """
        service.revoke_rank_credential(credentials, job_id)
        return Response(status_code=204)

    @router.post(
        "/credentials",
        **operation(
            IssuedCredentialView, "Issue a credential", "The new credential.", 422, status=201
        ),
    )
    @allow(ADMIN_ONLY)
    async def issue_credential(body: CredentialIn) -> dict[str, Any]:
        """A cluster read credential, or a tenant's credential naming the tenant.

        A read credential is for monitoring and the operator's page; a tenant's credential
        is ``tenant`` (its jobs), ``tenant-read`` (reading them) or ``zeus`` (its Zeus runs,
        the credential in the Zeus client's URL). The secret is shown only
        here; the server keeps its SHA-256.
        """
        return service.issue_credential(credentials, Scope(body.scope), body.tenant)

    @router.get(
        "/credentials",
        **operation(CredentialList, "List credentials", "The issued credentials, without secrets."),
    )
    @allow(JOB_READ)
    async def list_credentials(who: Principal = CALLER) -> dict[str, Any]:
        """Every issued credential (read, tenant and rank); secrets are never shown again.

        For each: id, scope, job or tenant, when it was issued, rotated and revoked (a
        tenant's credential: its tenant's and its jobs').
        """
        return {"credentials": service.credential_listing(credentials, sees_tenant(who))}

    @router.delete(
        "/credentials/{credential_id}",
        response_class=Response,
        **operation(None, "Revoke a credential", "Revoked.", 404, status=204),
    )
    @allow(ADMIN_ONLY)
    async def revoke_credential(credential_id: str) -> Response:
        """The credential stops working at once (404 when unknown or revoked already)."""
        service.revoke_credential(credentials, credential_id)
        return Response(status_code=204)

    return router
