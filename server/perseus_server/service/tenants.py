"""Tenants: teams sharing one server, each with its credentials, quotas and power share.

A team is a namespace on Kubernetes, an account on Slurm; each with its own credentials
(:mod:`perseus_server.service.credentials`), quotas and share of the cluster power budget
(``docs/server.md``, *Tenants*).

A tenant's quotas: ``max_jobs`` jobs stored at once and ``max_gpus`` GPUs over its jobs' world
sizes, and in the power budget a ``weight`` and ``guaranteed_watts`` (see
:mod:`perseus_server.service.tenant_shares`). A job over a quota is refused with 409 naming the
quota, and counted in ``perseus_refusals_total{tenant, reason}``.

**Quotas never over-commit the server.** A tenant without a quota of its own gets an equal part
of what the explicit quotas leave of the server's cap (``Limits.max_jobs``, ``Limits.max_gpus``),
and at most ``Limits.tenant_job_share`` of the cap (the ``default`` tenant, which a single-tenant
deployment's jobs belong to, is not held to that fraction: alone, it has the whole cap). The
quotas are *reservations*: a tenant is created, or a quota set, only while every tenant's
``max(held, quota)`` still fits in the cap (409 naming the quota otherwise), so a tenant below
its quota can always create its next job, whatever the others hold, and the server's cap never
refuses it.

The admin alone creates, changes and deletes tenants; a tenant with jobs cannot be deleted
(409), nor can the ``default`` one.
"""

from __future__ import annotations

import math
import re
import time
from typing import Any

from perseus_server.domain.errors import BadRequest, Conflict, NotFound
from perseus_server.domain.jobs import JobSpec
from perseus_server.domain.rows import DEFAULT_TENANT, TenantRow
from perseus_server.service.context import ServiceContext

__all__ = ["DEFAULT_TENANT", "TENANT_ID", "Tenants", "unknown_tenant"]

#: A tenant's id: a Kubernetes namespace or a Slurm account name (lower case, digits, ``-``,
#: ``_``, ``.``; 1 to 63 characters, starting and ending with a letter or digit).
TENANT_ID = re.compile(r"^[a-z0-9](?:[a-z0-9._-]{0,61}[a-z0-9])?$")

#: The quota fields ``POST /tenants`` and ``PATCH /tenants/{id}`` take.
QUOTA_FIELDS = ("max_jobs", "max_gpus", "weight", "guaranteed_watts")


def unknown_tenant(tenant_id: str) -> NotFound:
    """The answer to an unknown tenant.

    Also to another tenant's, so existence does not leak.
    """
    return NotFound(f"no tenant {tenant_id[:64]!r}", field="tenant_id")


class Tenants:
    """The tenants and their quotas (read from the store once, written through)."""

    def __init__(self, ctx: ServiceContext) -> None:
        self.ctx = ctx
        self._rows: dict[str, TenantRow] = {}

    def load(self) -> None:
        """Read the tenants from the store (the ``default`` one is always there)."""
        self._rows = {row.id: row for row in self.ctx.store.tenants()}
        if DEFAULT_TENANT not in self._rows:  # a store that predates tenants in memory
            self._rows[DEFAULT_TENANT] = TenantRow(DEFAULT_TENANT, time.time())

    # --- reading ---------------------------------------------------------------------------------

    def __contains__(self, tenant_id: object) -> bool:
        return tenant_id in self._rows

    def ids(self) -> list[str]:
        """Every tenant's id."""
        return list(self._rows)

    def get(self, tenant_id: str) -> TenantRow:
        """The tenant ``tenant_id``; 404 when it is unknown."""
        row = self._rows.get(tenant_id)
        if row is None:
            raise unknown_tenant(tenant_id)
        return row

    def _cap(self, kind: str) -> int:
        limits = self.ctx.limits
        return limits.max_jobs if kind == "max_jobs" else limits.max_gpus

    def quotas(self, kind: str, rows: list[TenantRow] | None = None) -> dict[str, int]:
        """Every tenant's ``kind`` quota (``max_jobs`` or ``max_gpus``) in force.

        Its own, else an equal part of what the explicit ones leave of the cap, at most
        ``tenant_job_share`` of it (not for ``default``).
        """
        rows = list(self._rows.values()) if rows is None else rows
        cap = self._cap(kind)
        out = {r.id: int(getattr(r, kind)) for r in rows if getattr(r, kind) is not None}
        open_ = [r.id for r in rows if getattr(r, kind) is None]
        if open_:
            per = max(0, cap - sum(out.values())) // len(open_)
            share = max(1, int(cap * self.ctx.limits.tenant_job_share))
            for t in open_:
                out[t] = per if t == DEFAULT_TENANT else min(per, share)
        return out

    def max_jobs(self, row: TenantRow) -> int:
        """The tenant's job quota in force (:meth:`quotas`)."""
        return self.quotas("max_jobs")[row.id]

    def max_gpus(self, row: TenantRow) -> int:
        """The tenant's GPU quota in force (:meth:`quotas`)."""
        return self.quotas("max_gpus")[row.id]

    def _check_reserved(self, rows: list[TenantRow], changed: str) -> None:
        """409 unless every tenant's ``max(held, quota)`` fits in the caps with ``rows``.

        ``changed``: the tenant being created or changed (named in the refusal).
        """
        usage = {r.id: self.usage(r.id) for r in rows}
        for k, (kind, what) in enumerate((("max_jobs", "jobs"), ("max_gpus", "GPUs"))):
            cap, quotas = self._cap(kind), self.quotas(kind, rows)
            empty = [t for t, q in quotas.items() if q < 1]
            reserved = sum(max(usage[t][k], q) for t, q in quotas.items())
            if reserved > cap or empty:
                raise Conflict(
                    f"the server's {cap} {what} ({kind}) cannot be reserved for every tenant "
                    f"with tenant {changed!r} so: their quotas and holdings come to {reserved}"
                    + (f", and tenant {empty[0]!r} would get none" if empty else "")
                    + "; lower a quota (PATCH /tenants/{id}) or delete jobs first",
                    field=kind,
                )

    def usage(self, tenant_id: str) -> tuple[int, int]:
        """(jobs, GPUs over their world sizes) the tenant holds."""
        jobs = gpus = 0
        for job in self.ctx.jobs:
            if job.row.tenant == tenant_id:
                jobs += 1
                gpus += job.spec.world_size
        return jobs, gpus

    def view(self, tenant_id: str) -> dict[str, Any]:
        """``GET /tenants/{id}``: the tenant, its quotas and what its jobs hold."""
        row = self.get(tenant_id)
        jobs, gpus = self.usage(tenant_id)
        return {
            "id": row.id,
            "created": row.created,
            "max_jobs": self.max_jobs(row),
            "max_gpus": self.max_gpus(row),
            "weight": row.weight,
            "guaranteed_watts": row.guaranteed_watts,
            "jobs": jobs,
            "gpus": gpus,
        }

    def listing(self, only: str | None = None) -> list[dict[str, Any]]:
        """Every tenant (``only``: just that one, for a tenant's own credential)."""
        return [self.view(t) for t in self._rows if only is None or t == only]

    # --- admitting a job -------------------------------------------------------------------------

    def admit(self, tenant_id: str, spec: JobSpec) -> None:
        """Refuse (409, naming the quota) a job the tenant's quotas do not leave room for."""
        row = self.get(tenant_id)
        jobs, gpus = self.usage(tenant_id)
        cap = self.max_jobs(row)
        if jobs >= cap:
            self.ctx.metrics.refusals.inc(tenant=tenant_id, reason="job_quota")
            raise Conflict(
                f"tenant {tenant_id!r} holds its quota of {cap} jobs; delete one first",
                field="max_jobs",
                tenant=tenant_id,
            )
        most = self.max_gpus(row)
        if gpus + spec.world_size > most:
            self.ctx.metrics.refusals.inc(tenant=tenant_id, reason="gpu_quota")
            raise Conflict(
                f"tenant {tenant_id!r} may hold {most} GPUs; its jobs hold {gpus} and "
                f"this one needs {spec.world_size} (world_size)",
                field="max_gpus",
                tenant=tenant_id,
            )

    # --- the admin's operations ------------------------------------------------------------------

    def create(self, tenant_id: str, quotas: dict[str, Any]) -> dict[str, Any]:
        """``POST /tenants``: 422 for a malformed id, 409 when it exists."""
        if not TENANT_ID.fullmatch(tenant_id):
            raise BadRequest(
                "a tenant id is 1 to 63 lower-case letters, digits, '-', '_' or '.', starting "
                f"and ending with a letter or digit (a namespace or account), got {tenant_id[:64]!r}",
                field="id",
            )
        if tenant_id in self._rows:
            raise Conflict(f"tenant {tenant_id!r} exists; PATCH it", field="id")
        row = TenantRow(tenant_id, time.time())
        self._apply(row, quotas)
        self._check_reserved([*self._rows.values(), row], tenant_id)
        self.ctx.store.put_tenant(row)
        self._rows[tenant_id] = row
        return self.view(tenant_id)

    def patch(self, tenant_id: str, quotas: dict[str, Any]) -> dict[str, Any]:
        """``PATCH /tenants/{id}``: the given quotas change, the others stay.

        Null: the default again.
        """
        old = self.get(tenant_id)
        row = TenantRow(
            old.id, old.created, old.max_jobs, old.max_gpus, old.weight, old.guaranteed_watts
        )
        self._apply(row, quotas)
        if (row.max_jobs, row.max_gpus) != (old.max_jobs, old.max_gpus):
            self._check_reserved(
                [row if r.id == tenant_id else r for r in self._rows.values()], tenant_id
            )
        self.ctx.store.put_tenant(row)
        self._rows[tenant_id] = row
        return self.view(tenant_id)

    def delete(self, tenant_id: str) -> None:
        """``DELETE /tenants/{id}``: 409 for the default tenant or one that holds jobs."""
        self.get(tenant_id)
        if tenant_id == DEFAULT_TENANT:
            raise Conflict("the default tenant cannot be deleted", field="tenant_id")
        jobs, _ = self.usage(tenant_id)
        if jobs:
            raise Conflict(
                f"tenant {tenant_id!r} holds {jobs} job(s); delete them first", field="tenant_id"
            )
        self.ctx.store.delete_tenant(tenant_id)
        del self._rows[tenant_id]

    @staticmethod
    def _apply(row: TenantRow, quotas: dict[str, Any]) -> None:
        for name, value in quotas.items():
            if name not in QUOTA_FIELDS:
                raise BadRequest(f"unknown field {name!r}", field=name)
            if name == "weight":
                value = 1.0 if value is None else float(value)
                if not (math.isfinite(value) and value > 0):
                    raise BadRequest("must be a finite number > 0", field=name)
            elif name == "guaranteed_watts":
                value = 0.0 if value is None else float(value)
                if not (math.isfinite(value) and value >= 0):
                    raise BadRequest("must be a finite number of watts >= 0", field=name)
            setattr(row, name, value)
