"""The rows a :class:`~perseus_server.domain.store.Store` reads and writes: plain values.

The same whichever backend keeps them (:mod:`perseus_server.runtime.sql_store`, SQLite or PostgreSQL).
"""

from __future__ import annotations

from perseus_server.domain.jobs import JobSpec
from perseus_server.domain.states import SolveStatus

__all__ = [
    "DEFAULT_TENANT",
    "CredentialRow",
    "FrontierRow",
    "IterationRow",
    "JobRow",
    "RankIteration",
    "TenantRow",
]

#: The tenant of every job and credential that names none: a single-tenant deployment's jobs
#: (and those stored before tenants existed) belong to it.
DEFAULT_TENANT = "default"

#: One reported iteration as the store appends it: ``(rank_id, iteration, time, energy,
#: plan_version)``.
IterationRow = tuple[str, int, float, float, int]
#: One stored iteration of a rank as the store returns it: ``(iteration, time, energy,
#: plan_version)``.
RankIteration = tuple[int, float, float, int]


class JobRow:
    """A stored job, and the tenant it belongs to."""

    __slots__ = ("id", "created", "spec", "tenant")

    def __init__(
        self, id: str, created: float, spec: JobSpec, tenant: str = DEFAULT_TENANT
    ) -> None:
        self.id, self.created, self.spec, self.tenant = id, created, spec, tenant


class FrontierRow:
    """The frontier state of a job (``status``: see :class:`SolveStatus`).

    ``doc`` is the last successfully computed frontier (``Frontier.to_json(compact=True)``), kept
    while a newer computation runs or after one failed; ``partial``: it is only the first plan
    of a computation (one point), the rest not computed (yet: status ``partial``; or ever: the
    computation failed or was cancelled after it).
    """

    __slots__ = (
        "status",
        "progress",
        "error",
        "doc",
        "profile_revision",
        "started",
        "finished",
        "solve_seconds",
        "partial",
    )

    def __init__(
        self,
        status: SolveStatus = SolveStatus.NONE,
        progress: float = 0.0,
        error: str | None = None,
        doc: str | None = None,
        profile_revision: int | None = None,
        started: float | None = None,
        finished: float | None = None,
        solve_seconds: float | None = None,
        partial: bool = False,
    ) -> None:
        self.status = SolveStatus(status)
        self.partial = bool(partial)
        self.progress, self.error, self.doc = progress, error, doc
        self.profile_revision, self.started, self.finished = profile_revision, started, finished
        self.solve_seconds = solve_seconds


class CredentialRow:
    """A stored credential: its scope, job, secret's digest, dates and tenant.

    Its ``scope`` (``read``, ``rank``, ``tenant`` or ``tenant-read``), job (rank credentials),
    the SHA-256 digest of its secret, when it was created, last rotated and revoked, and its
    tenant (tenant credentials; None for the others).
    """

    __slots__ = ("id", "scope", "job_id", "hash", "created", "rotated", "revoked", "tenant")

    def __init__(
        self,
        id: str,
        scope: str,
        job_id: str | None,
        hash: str,
        created: float,
        rotated: float | None,
        revoked: float | None,
        tenant: str | None = None,
    ) -> None:
        self.id, self.scope, self.job_id, self.hash = id, scope, job_id, hash
        self.created, self.rotated, self.revoked = created, rotated, revoked
        self.tenant = tenant


class TenantRow:
    """A stored tenant and its quotas.

    A tenant is a team: a Kubernetes namespace, a Slurm account. Its quotas: ``max_jobs`` and
    ``max_gpus`` (None: the server's defaults), its ``weight`` in the cluster power budget and
    the watts it is guaranteed there (``guaranteed_watts``).
    """

    __slots__ = ("id", "created", "max_jobs", "max_gpus", "weight", "guaranteed_watts")

    def __init__(
        self,
        id: str,
        created: float,
        max_jobs: int | None = None,
        max_gpus: int | None = None,
        weight: float = 1.0,
        guaranteed_watts: float = 0.0,
    ) -> None:
        self.id, self.created = id, created
        self.max_jobs, self.max_gpus = max_jobs, max_gpus
        self.weight, self.guaranteed_watts = float(weight), float(guaranteed_watts)
