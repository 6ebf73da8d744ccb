"""The facade's administration: tenants, the cluster power budget and credentials.

:class:`AdministrationFacade` is a part of :class:`~perseus_server.service.facade.PerseusService`
(its base class), kept in a module of its own so that each stays short: the REST routes of
tenants, the power budget and credentials call these methods, never the parts behind them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from perseus_server.domain.errors import BadRequest, NotFound
from perseus_server.domain.store import Store
from perseus_server.service.credentials import Credentials, Scope
from perseus_server.service.power_budget import PowerBudget
from perseus_server.service.state import JobTable
from perseus_server.service.tenants import Tenants

__all__ = ["AdministrationFacade"]


class AdministrationFacade:
    """Tenants, the power budget and credentials, over the parts the facade builds."""

    store: Store
    jobs: JobTable
    tenants: Tenants
    power_budget: PowerBudget

    def tenant_of(self, job_id: str) -> str | None:
        """The tenant of a stored job (None: no such job)."""
        return self.jobs.get(job_id).row.tenant if job_id in self.jobs else None

    def has_tenant(self, tenant_id: str) -> bool:
        """Whether the tenant exists."""
        return tenant_id in self.tenants

    def create_tenant(self, tenant_id: str, quotas: dict[str, Any]) -> dict[str, Any]:
        """``POST /tenants``: a tenant with its quotas."""
        return self.tenants.create(tenant_id, quotas)

    def tenant_listing(self, only: str | None = None) -> list[dict[str, Any]]:
        """``GET /tenants``: every tenant (``only``: that one)."""
        return self.tenants.listing(only)

    def tenant(self, tenant_id: str) -> dict[str, Any]:
        """``GET /tenants/{id}``: the tenant's quotas and holdings."""
        return self.tenants.view(tenant_id)

    def patch_tenant(self, tenant_id: str, quotas: dict[str, Any]) -> dict[str, Any]:
        """``PATCH /tenants/{id}``: change the quotas given; the power budget is re-shared."""
        out = self.tenants.patch(tenant_id, quotas)
        self.power_budget.recompute(f"tenant {tenant_id} changed")
        return out

    def delete_tenant(self, tenant_id: str) -> None:
        """``DELETE /tenants/{id}``: the tenant and its credentials (409 while it holds jobs)."""
        self.tenants.delete(tenant_id)

    def set_power_budget(
        self, watts: float, policy: str, jobs: list[str] | None, on_infeasible: str
    ) -> dict[str, Any]:
        """``PUT /power-budget``: the cluster's power budget (a bad one changes nothing)."""
        return self.power_budget.put(watts, policy, jobs, on_infeasible)

    def power_budget_view(self, tenant: str | None = None) -> dict[str, Any]:
        """``GET /power-budget`` (``tenant``: its jobs' shares only)."""
        return self.power_budget.view(tenant)

    def delete_power_budget(self) -> None:
        """``DELETE /power-budget`` (404 when none is set)."""
        self.power_budget.delete()

    def authority(self, admin: str | None, read: Sequence[str] = ()) -> Credentials:
        """The credential authority over this service's store, with the configured tokens.

        The gates authenticate with it; the credential routes pass it to the methods below.
        """
        return Credentials(self.store, admin=admin, read=read)

    def rotate_rank_credential(self, credentials: Credentials, job_id: str) -> dict[str, Any]:
        """A new secret for the job's rank credential (404 for no such job)."""
        self.jobs.get(job_id)
        return credentials.rotate_rank(job_id).to_json()

    def revoke_rank_credential(self, credentials: Credentials, job_id: str) -> None:
        """The job's rank credential stops working (404: no job, or none in force)."""
        self.jobs.get(job_id)
        if not credentials.revoke_rank(job_id):
            raise NotFound(f"job {job_id} has no rank credential in force", field="job_id")

    def issue_credential(
        self, credentials: Credentials, scope: Scope, tenant: str | None
    ) -> dict[str, Any]:
        """``POST /credentials``: a read credential, or a tenant's naming its tenant (422 else)."""
        if scope is Scope.READ:
            if tenant is not None:
                raise BadRequest(
                    "a read credential reads every tenant; for one tenant's, give scope "
                    "'tenant-read'",
                    field="tenant",
                )
            return credentials.issue(scope).to_json()
        if tenant is None:
            raise BadRequest(f"a {scope} credential names its tenant", field="tenant")
        if tenant not in self.tenants:
            raise BadRequest(f"no tenant {tenant!r}; POST /tenants first", field="tenant")
        return credentials.issue(scope, tenant=tenant).to_json()

    def credential_listing(
        self, credentials: Credentials, tenant: str | None
    ) -> list[dict[str, Any]]:
        """``GET /credentials`` without secrets (``tenant``: its own and its jobs')."""
        if tenant is None:
            return credentials.listing()
        return credentials.tenant_listing(tenant, lambda job: self.tenant_of(job) == tenant)

    def revoke_credential(self, credentials: Credentials, credential_id: str) -> None:
        """``DELETE /credentials/{id}`` (404 when unknown or revoked already)."""
        if not credentials.revoke(credential_id):
            raise NotFound(f"no credential {credential_id!r} in force", field="credential_id")
