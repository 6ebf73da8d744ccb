"""Who may call what: the one authorization table.

Credential kind x route or gRPC method x own / other tenant, that the REST gate
(:mod:`perseus_server.rest.gate`) and the gRPC gate (:mod:`perseus_server.grpc.gate`) both read. Its rules are named here; the routes' rows are
:data:`REST`, the gRPC methods' rows their declarations (each names its rule:
:mod:`perseus_server.grpc.methods`). ``docs/server.md`` prints it (:func:`markdown_table`), and
``tests/server/service/test_authorization_matrix.py`` checks every cell against a running server,
walking the routes from the app's router and the methods from the ``.proto``: a route or method
missing fails that test (and is refused to every credential but the admin's).

Credential kinds (:class:`~perseus_server.service.credentials.Scope`):

- ``admin``: the configured token; everything, every tenant.
- ``read``: the configured read token and issued cluster read credentials: the platform's
  monitoring. It reads every tenant's jobs (as before tenants existed), changes nothing.
- ``tenant``: a tenant's (team's) credential: creates jobs in its tenant and reads and changes
  only those.
- ``tenant-read``: reads its tenant's jobs only.
- ``rank``: one job's rank credential: that job's gRPC calls as its ranks, and its status.
- ``zeus``: a tenant's credential for Zeus clients, sent in the URL: that tenant's Zeus runs
  (the ``/zeus`` routes, :mod:`perseus_server.rest.zeus`), nothing else.

A cell is an :class:`Access`: ``any`` (any job or tenant), ``own`` (the caller's tenant's jobs,
or a rank credential's own job; another's answers 404 exactly as an unknown id does, so
existence does not leak; a listing shows only the caller's), or ``none`` (403 on REST,
PERMISSION_DENIED on gRPC). On gRPC, a rank credential naming another job is refused with
PERMISSION_DENIED (it names its own job; see :mod:`perseus_server.grpc.gate`).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType

from perseus_server.service.credentials import Principal, Scope

__all__ = [
    "PUBLIC",
    "REST",
    "TENANT_SCOPES",
    "Access",
    "access",
    "markdown_table",
    "sees_tenant",
]


class Access(StrEnum):
    """What one credential kind may do on one route or method (see the module docstring)."""

    ANY = "any"
    OWN = "own"
    NONE = "none"


#: The credential kinds scoped to one tenant.
TENANT_SCOPES = frozenset({Scope.TENANT, Scope.TENANT_READ})

Rule = Mapping[Scope, Access]


def _rule(
    *,
    read: Access = Access.NONE,
    tenant: Access = Access.NONE,
    tenant_read: Access = Access.NONE,
    rank: Access = Access.NONE,
    zeus: Access = Access.NONE,
) -> Rule:
    return MappingProxyType(
        {
            Scope.ADMIN: Access.ANY,
            Scope.READ: read,
            Scope.TENANT: tenant,
            Scope.TENANT_READ: tenant_read,
            Scope.RANK: rank,
            Scope.ZEUS: zeus,
        }
    )


_A, _O = Access.ANY, Access.OWN
#: Reading a job (or a listing, filtered to the caller's tenant).
JOB_READ = _rule(read=_A, tenant=_O, tenant_read=_O)
#: A job's status: also its own rank credential.
JOB_STATUS = _rule(read=_A, tenant=_O, tenant_read=_O, rank=_O)
#: Changing a job (or creating one, in the caller's tenant).
JOB_WRITE = _rule(tenant=_O)
#: The admin alone: tenants, quotas, credentials, the cluster budget.
ADMIN_ONLY = _rule()
#: A rank's gRPC calls: its own job's ranks only.
RANK_CALL = _rule(rank=_O)
#: Zeus's routes (``perseus serve --zeus``): a tenant's runs, through a tenant or zeus credential.
ZEUS_RUN = _rule(tenant=_O, zeus=_O)

#: Routes that need no credential (they hold no data).
PUBLIC = frozenset({"GET /healthz"})

#: REST: ``"METHOD /template"`` -> the rule (``HEAD`` is read as ``GET``).
REST: Mapping[str, Rule] = MappingProxyType(
    {
        "GET /healthz": _rule(read=_A, tenant=_A, tenant_read=_A, rank=_A),
        "GET /metrics": JOB_READ,
        "POST /jobs": JOB_WRITE,
        "GET /jobs": JOB_READ,
        "GET /jobs/{job_id}": JOB_READ,
        "DELETE /jobs/{job_id}": JOB_WRITE,
        "POST /jobs/{job_id}/finish": JOB_WRITE,
        "PUT /jobs/{job_id}/profile": JOB_WRITE,
        "GET /jobs/{job_id}/profile": JOB_READ,
        "POST /jobs/{job_id}/frontier": JOB_WRITE,
        "GET /jobs/{job_id}/frontier": JOB_READ,
        "DELETE /jobs/{job_id}/frontier": JOB_WRITE,
        "GET /jobs/{job_id}/frontier.png": JOB_READ,
        "GET /jobs/{job_id}/plan": JOB_READ,
        "PUT /jobs/{job_id}/plan": JOB_WRITE,
        "GET /jobs/{job_id}/status": JOB_STATUS,
        "POST /jobs/{job_id}/profiling": JOB_WRITE,
        "GET /jobs/{job_id}/profiling": JOB_READ,
        "DELETE /jobs/{job_id}/profiling": JOB_WRITE,
        "POST /jobs/{job_id}/stragglers": JOB_WRITE,
        "DELETE /jobs/{job_id}/stragglers": JOB_WRITE,
        "PUT /jobs/{job_id}/straggler-detection": JOB_WRITE,
        "POST /jobs/{job_id}/credentials/rotate": JOB_WRITE,
        "DELETE /jobs/{job_id}/credentials": JOB_WRITE,
        "PUT /power-budget": ADMIN_ONLY,
        "GET /power-budget": JOB_READ,
        "DELETE /power-budget": ADMIN_ONLY,
        "POST /credentials": ADMIN_ONLY,
        "GET /credentials": JOB_READ,
        "DELETE /credentials/{credential_id}": ADMIN_ONLY,
        "POST /tenants": ADMIN_ONLY,
        "GET /tenants": JOB_READ,
        "GET /tenants/{tenant_id}": JOB_READ,
        "PATCH /tenants/{tenant_id}": ADMIN_ONLY,
        "DELETE /tenants/{tenant_id}": ADMIN_ONLY,
        "POST /zeus/register_job": ZEUS_RUN,
        "POST /zeus/register_rank/{job_id}": ZEUS_RUN,
        "GET /zeus/schedule/{job_id}": ZEUS_RUN,
        "POST /zeus/result/{job_id}": ZEUS_RUN,
    }
)


def access(who: Principal, rule: Rule | None) -> Access:
    """What ``who`` may do under ``rule``.

    A route or method the table lacks: the admin only.
    """
    if rule is None:
        return Access.ANY if who.scope is Scope.ADMIN else Access.NONE
    return rule[who.scope]


def sees_tenant(who: Principal) -> str | None:
    """The one tenant whose jobs ``who`` sees.

    None: every tenant's, or, for a rank credential, only its own job's, which the gates check
    by job.
    """
    return who.tenant if who.scope in TENANT_SCOPES else None


def markdown_table(grpc: Mapping[str, Rule]) -> str:
    """The table as Markdown: :data:`REST`, then the gRPC methods' ``grpc`` rules.

    ``docs/server.md`` prints it (a test keeps them equal).
    """
    kinds = list(Scope)
    head = "| route or method | " + " | ".join(k.value for k in kinds) + " |"
    lines = [head, "|---" * (len(kinds) + 1) + "|"]
    for key, rule in REST.items():
        shown = f"`{key}`" + (" (public)" if key in PUBLIC else "")
        lines.append(f"| {shown} | " + " | ".join(rule[k].value for k in kinds) + " |")
    for name, rule in grpc.items():
        lines.append(f"| gRPC `{name}` | " + " | ".join(rule[k].value for k in kinds) + " |")
    return "\n".join(lines)
