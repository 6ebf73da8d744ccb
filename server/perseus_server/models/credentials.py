"""Response and request models of the credential routes, and of a job's creation.

A job's creation carries the job's rank credential once.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from perseus_server.models.base import ResponseModel, omitted
from perseus_server.models.responses import JobView

__all__ = ["CredentialIn", "CredentialList", "CredentialView", "IssuedCredentialView", "JobCreated"]

_SCOPE = "``read`` (the cluster's monitoring: reads every tenant's jobs), ``tenant`` (its "
_SCOPE += "tenant's jobs), ``tenant-read`` (reads its tenant's jobs) or ``rank`` (its job's "
_SCOPE += "gRPC calls as its ranks, and its status)."
_Scope = Literal["read", "tenant", "tenant-read", "rank"]


class JobCreated(JobView):
    """A new job; with a token configured, also its rank credential (shown only here)."""

    rank_credential: str = omitted(
        "The job's rank credential (bearer token of its ranks' gRPC calls), present when the "
        "server has a token. Shown once: only its SHA-256 is stored; rotate it to get a new one."
    )


class CredentialIn(BaseModel):
    """The credential to issue."""

    model_config = ConfigDict(extra="forbid")

    scope: Literal["read", "tenant", "tenant-read"] = Field(
        description="``read``: reads every tenant's jobs (monitoring, the operator's page); "
        "``tenant``: creates jobs in ``tenant`` and reads and changes only those; "
        "``tenant-read``: reads ``tenant``'s jobs only."
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
