"""Who may call what: the one authorization table, its rows declared where each endpoint is.

Credential kind x route or gRPC method x own / other tenant, that the REST gate
(:mod:`perseus_server.rest.gate`) and the gRPC gate (:mod:`perseus_server.grpc.gate`) both read.
Its rules are named here, and each endpoint declares its own, the same way on both adapters: a
REST route with :func:`allow` on its function (:mod:`perseus_server.rest`), a gRPC method in its
declaration (:mod:`perseus_server.grpc.methods`). Each adapter's rows are :func:`table` of its
declarations: a key declared twice, or an endpoint without a rule, is an error when the table is
built (the server does not start), and a route or method the table lacks is refused to every
credential but the admin's (:func:`access`). ``docs/server.md`` prints the table
(:func:`markdown_table`), and ``tests/server/service/test_authorization_matrix.py`` checks every
cell against a running server, walking the routes from the app's router and the methods from the
``.proto``.

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

from collections.abc import Callable, Iterable, Mapping
from enum import StrEnum
from types import MappingProxyType
from typing import TypeVar

from perseus_server.service.credentials import Principal, Scope

__all__ = [
    "PUBLIC",
    "TENANT_SCOPES",
    "Access",
    "Rule",
    "access",
    "allow",
    "markdown_table",
    "rule_of",
    "sees_tenant",
    "table",
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
#: A route that needs no credential (it holds no data): the REST gate checks none there.
PUBLIC = _rule(read=_A, tenant=_A, tenant_read=_A, rank=_A)
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

#: The attribute :func:`allow` sets on an endpoint's function.
_RULE_ATTRIBUTE = "__perseus_rule__"

F = TypeVar("F", bound=Callable[..., object])


def allow(rule: Rule) -> Callable[[F], F]:
    """Declare who may call an endpoint: a decorator that gives its function ``rule``, once.

    A REST route puts it under its route decorator::

        @router.get("/jobs/{job_id}", ...)
        @allow(JOB_READ)
        async def get_job(job_id: str) -> ...: ...

    A second rule on the same function is a :class:`TypeError` (an endpoint has exactly one).
    """

    def declare(endpoint: F) -> F:
        if rule_of(endpoint) is not None:
            raise TypeError(f"{endpoint.__qualname__}: its access rule is declared twice")
        setattr(endpoint, _RULE_ATTRIBUTE, rule)
        return endpoint

    return declare


def rule_of(endpoint: object) -> Rule | None:
    """The rule :func:`allow` declared on ``endpoint`` (None: none)."""
    found = getattr(endpoint, _RULE_ATTRIBUTE, None)
    return found if isinstance(found, Mapping) else None


def table(rows: Iterable[tuple[str, Rule | None]]) -> Mapping[str, Rule]:
    """One adapter's rows of the table, from its endpoints' declarations, in their order.

    ``rows``: each endpoint's key (``"METHOD /template"``, a gRPC method's name) and the rule it
    declared. A key without a rule or declared twice is a :class:`ValueError`: every endpoint
    has exactly one rule.
    """
    out: dict[str, Rule] = {}
    for key, rule in rows:
        if rule is None:
            raise ValueError(f"{key}: no access rule declared (declare one where it is defined)")
        if key in out:
            raise ValueError(f"{key}: declared twice")
        out[key] = rule
    return MappingProxyType(out)


def access(who: Principal, rule: Rule | None) -> Access:
    """What ``who`` may do under ``rule``.

    A route or method the table lacks (``rule`` None): the admin only.
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


def markdown_table(rest: Mapping[str, Rule], grpc: Mapping[str, Rule]) -> str:
    """The table as Markdown: the routes' ``rest`` rules, then the gRPC methods' ``grpc`` rules.

    ``docs/server.md`` prints it (a test keeps them equal).
    """
    kinds = list(Scope)
    head = "| route or method | " + " | ".join(k.value for k in kinds) + " |"
    lines = [head, "|---" * (len(kinds) + 1) + "|"]
    for key, rule in rest.items():
        shown = f"`{key}`" + (" (public)" if rule is PUBLIC else "")
        lines.append(f"| {shown} | " + " | ".join(rule[k].value for k in kinds) + " |")
    for name, rule in grpc.items():
        lines.append(f"| gRPC `{name}` | " + " | ".join(rule[k].value for k in kinds) + " |")
    return "\n".join(lines)
