"""Scoped credentials: who a call comes from, once a token is configured.

Six scopes (:class:`Scope`); what each opens is the authorization table of
:mod:`perseus_server.service.authorization`:

- **admin** — the configured token (``--token-file``): every REST route and gRPC method;
- **read** — a configured read token (``--read-token-file``) or one the admin issues through
  ``POST /credentials``: the cluster's monitoring, reading every tenant's jobs;
- **tenant** / **tenant-read** — issued by the admin for one tenant (``POST /credentials``
  with ``tenant``): that tenant's jobs only (``tenant-read``: reading them);
- **rank** — issued per job when it is created (``rank_credential`` in the answer, shown once),
  rotated by ``POST /jobs/{id}/credentials/rotate`` and revoked by
  ``DELETE /jobs/{id}/credentials``: that job's ``RegisterRank`` / ``WatchPlan`` /
  ``ReportIterations`` / ``FinishRank``, and its status;
- **zeus** — issued by the admin for one tenant: that tenant's Zeus runs (the ``/zeus`` routes of
  ``perseus serve --zeus``), sent in the URL (``/zeus/<credential>/...``) as the Zeus client
  cannot send a header; nothing else.

A rank identity registered with a rank credential is bound to it (:meth:`Credentials.bind`):
registering the same ``(job, global_rank)``, watching or reporting as that rank with any other
rank credential is refused. A rotation keeps the credential's id, so its identities stay bound
to it; identities registered with the admin token are not bound (the admin may act as any rank).

Secrets are 32 random bytes (URL-safe base64, with a prefix naming the scope). The store keeps
only their SHA-256 digest; a presented secret is looked up by its digest (so lookup time tells
nothing about the secret) and the digests compared with :func:`hmac.compare_digest`. The
configured admin and read tokens are compared in constant time with the presented one.

A call's principal is fixed when it starts, so each credential also has an in-memory
**generation**, bumped by every rotation and revocation: a principal carries the generation it
was identified at, and :meth:`Credentials.current` (``O(1)``) tells a stream already open (each
report of ``ReportIterations``, each message of ``WatchPlan``) that its credential changed since.

With no admin token configured the server is open: :attr:`Credentials.enabled` is false and
:meth:`Credentials.identify` answers the admin principal for anything.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from perseus_server.domain.errors import ApiError
from perseus_server.domain.rows import CredentialRow
from perseus_server.domain.store import Store

__all__ = [
    "ADMIN",
    "Credentials",
    "Forbidden",
    "IssuedCredential",
    "Principal",
    "Scope",
    "bearer_secret",
    "digest",
]


class Scope(StrEnum):
    """What a credential opens (see the module docstring)."""

    ADMIN = "admin"
    READ = "read"
    TENANT = "tenant"
    TENANT_READ = "tenant-read"
    RANK = "rank"
    ZEUS = "zeus"


class Forbidden(ApiError):
    """The credential is valid but its scope does not allow the call.

    HTTP 403, gRPC PERMISSION_DENIED.
    """

    status = 403
    title = "Forbidden"


@dataclass(frozen=True)
class Principal:
    """Who a request comes from: a scope, and for issued credentials their id.

    Also, for issued credentials, their job or tenant.
    """

    scope: Scope
    credential_id: str | None = None
    job_id: str | None = None
    generation: int = 0
    tenant: str | None = None

    def allows(self, needed: Scope) -> bool:
        """Whether this principal may do what needs ``needed`` (admin may do everything)."""
        return self.scope is Scope.ADMIN or self.scope is needed


#: The principal of the admin token (and of every call to an open server).
ADMIN = Principal(Scope.ADMIN)


@dataclass(frozen=True)
class IssuedCredential:
    """A credential just issued or rotated: the only time its ``secret`` is known."""

    id: str
    scope: Scope
    job_id: str | None
    secret: str
    created: float
    tenant: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The principal as shown: id, scope, and its job or tenant when it has one."""
        out: dict[str, Any] = {"id": self.id, "scope": self.scope.value}
        if self.job_id is not None:
            out["job_id"] = self.job_id
        if self.tenant is not None:
            out["tenant"] = self.tenant
        out["credential"] = self.secret
        out["created"] = self.created
        return out


def digest(secret: str) -> str:
    """The stored form of a secret: its SHA-256, hex."""
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def bearer_secret(authorization: str) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` value (None for another scheme)."""
    scheme, _, given = authorization.partition(" ")
    if scheme.lower() != "bearer":
        return None
    given = given.strip()
    return given or None


def _same(a: str, b: str) -> bool:
    return secrets.compare_digest(a.encode("utf-8"), b.encode("utf-8"))


def _view(row: CredentialRow) -> dict[str, Any]:
    out: dict[str, Any] = {"id": row.id, "scope": row.scope}
    if row.job_id is not None:
        out["job_id"] = row.job_id
    if row.tenant is not None:
        out["tenant"] = row.tenant
    out.update(created=row.created, rotated=row.rotated, revoked=row.revoked)
    return out


class Credentials:
    """The configured tokens and the issued credentials (in ``store``).

    See the module docstring. ``store`` may be None when only configured tokens are used.
    """

    def __init__(self, store: Store | None, *, admin: str | None, read: Sequence[str] = ()) -> None:
        if read and admin is None:
            raise ValueError("a read token needs an admin token")
        self.store = store
        self.admin = admin
        self.read = tuple(read)
        self._generation: dict[str, int] = {}

    @property
    def enabled(self) -> bool:
        """Whether calls must authenticate (an admin token is configured)."""
        return self.admin is not None

    # --- authentication --------------------------------------------------------------------------

    def identify(self, secret: str | None) -> Principal | None:
        """The principal a presented secret belongs to (None: none, or a revoked one)."""
        if not self.enabled:
            return ADMIN
        if secret is None:
            return None
        assert self.admin is not None
        if _same(secret, self.admin):
            return ADMIN
        if any(_same(secret, t) for t in self.read):
            return Principal(Scope.READ)
        if self.store is None:
            return None
        d = digest(secret)
        row = self.store.credential_by_hash(d)
        if row is None or row.revoked is not None or not hmac.compare_digest(row.hash, d):
            return None
        gen = self._generation.get(row.id, 0)
        return Principal(Scope(row.scope), row.id, row.job_id, gen, row.tenant)

    def current(self, who: Principal) -> bool:
        """Whether ``who``'s credential is still the one it was identified with; ``O(1)``.

        That is, not rotated or revoked since. Configured tokens are always current.
        """
        cid = who.credential_id
        return cid is None or self._generation.get(cid, 0) == who.generation

    def _changed(self, credential_id: str) -> None:
        self._generation[credential_id] = self._generation.get(credential_id, 0) + 1

    def from_header(self, authorization: str) -> Principal | None:
        """The principal of an ``Authorization`` header value."""
        return self.identify(bearer_secret(authorization))

    def from_metadata(self, metadata: Iterable[tuple[str, Any]] | None) -> Principal | None:
        """The principal of a gRPC call's ``authorization`` metadata."""
        if not self.enabled:
            return ADMIN
        for key, value in metadata or ():
            if str(key).lower() == "authorization":
                found = self.from_header(str(value))
                if found is not None:
                    return found
        return None

    # --- issuing, rotating, revoking -------------------------------------------------------------

    def _store(self) -> Store:
        if self.store is None:
            raise RuntimeError("issued credentials need a store")
        return self.store

    def issue(
        self, scope: Scope, job_id: str | None = None, tenant: str | None = None
    ) -> IssuedCredential:
        """A new credential of ``scope``.

        ``job_id``: the job of a rank credential; ``tenant``: the tenant of a tenant,
        tenant-read or zeus credential.
        """
        if (scope is Scope.RANK) != (job_id is not None):
            raise ValueError("a rank credential, and only one, names its job")
        if (scope in (Scope.TENANT, Scope.TENANT_READ, Scope.ZEUS)) != (tenant is not None):
            raise ValueError("a tenant credential, and only one, names its tenant")
        if scope is Scope.ADMIN:
            raise ValueError("the admin token is configured, never issued")
        secret = f"perseus-{scope.value}-{secrets.token_urlsafe(32)}"
        row = self._store().add_credential(
            f"cred-{secrets.token_hex(8)}", scope.value, job_id, digest(secret), tenant
        )
        return IssuedCredential(row.id, scope, job_id, secret, row.created, tenant)

    def rank_credential(self, job_id: str) -> CredentialRow | None:
        """The job's rank credential (revoked or not), the first issued."""
        rows = [r for r in self._store().credentials(job_id) if r.scope == Scope.RANK.value]
        return rows[0] if rows else None

    def rotate_rank(self, job_id: str) -> IssuedCredential:
        """A new secret for the job's rank credential (issued if it has none).

        The old secret stops working, a revoked credential works again with the new one, and
        the rank identities bound to it stay bound.
        """
        row = self.rank_credential(job_id)
        if row is None:
            return self.issue(Scope.RANK, job_id)
        secret = f"perseus-{Scope.RANK.value}-{secrets.token_urlsafe(32)}"
        self._store().rotate_credential(row.id, digest(secret))
        self._changed(row.id)
        return IssuedCredential(row.id, Scope.RANK, job_id, secret, row.created)

    def revoke_rank(self, job_id: str) -> bool:
        """Revoke the job's rank credential; False when it has none in force."""
        row = self.rank_credential(job_id)
        return row is not None and self.revoke(row.id)

    def revoke(self, credential_id: str) -> bool:
        """Revoke an issued credential by id; False when unknown or revoked already."""
        done = self._store().revoke_credential(credential_id)
        if done:
            self._changed(credential_id)
        return done

    def listing(self) -> list[dict[str, Any]]:
        """Every issued credential without its secret (id, scope, job, tenant, times)."""
        return [_view(r) for r in self._store().credentials()]

    def tenant_listing(self, tenant: str, jobs: Callable[[str], bool]) -> list[dict[str, Any]]:
        """A tenant's credentials and its jobs' rank credentials.

        What ``GET /credentials`` shows a tenant credential.
        """
        return [
            _view(r)
            for r in self._store().credentials()
            if r.tenant == tenant or (r.job_id is not None and jobs(r.job_id))
        ]

    # --- rank identities -------------------------------------------------------------------------

    def register_refusal(self, who: Principal, job_id: str, global_rank: int) -> str | None:
        """Why ``who`` may not register rank ``global_rank`` of ``job_id`` (None: it may)."""
        if who.scope is Scope.ADMIN:
            return None
        if who.scope is not Scope.RANK:
            return f"a {who.scope} credential cannot register ranks"
        if who.job_id != job_id:
            return f"job_id: this rank credential belongs to another job, not {job_id}"
        bound = self._store().slot_binding(job_id, global_rank)
        if bound is not None and bound != who.credential_id:
            return (
                f"global_rank: rank {global_rank} of job {job_id} was registered with another "
                "credential"
            )
        return None

    def bind(self, who: Principal, rank_id: str, job_id: str, global_rank: int) -> str | None:
        """Bind a rank identity just registered by ``who`` (rank scope).

        Returns why it is refused when another credential got it first (None: bound to
        ``who``).
        """
        if who.scope is not Scope.RANK or who.credential_id is None:
            return None
        got = self._store().bind_rank(rank_id, job_id, global_rank, who.credential_id)
        if got != who.credential_id:
            return f"global_rank: rank {global_rank} of job {job_id} is bound to another credential"
        return None

    def rank_refusal(self, who: Principal, job_id: str, rank_id: str) -> str | None:
        """Why ``who`` may not watch plans or report as ``rank_id`` of ``job_id``.

        None: it may.
        """
        if who.scope is Scope.ADMIN:
            return None
        if who.scope is not Scope.RANK:
            return f"a {who.scope} credential cannot act as a rank"
        if who.job_id != job_id:
            return f"job_id: this rank credential belongs to another job, not {job_id}"
        bound = self._store().rank_binding(rank_id)
        if bound is None or bound[1] != who.credential_id:
            return (
                f"rank_id: rank {rank_id!r} was not registered with this credential; "
                "call RegisterRank with it first"
            )
        return None
