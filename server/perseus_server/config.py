"""Server configuration and the documented size limits."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Limits", "ServerConfig", "ZeusConfig", "read_token"]


#: The longest token file read (bytes): a token is one short line.
MAX_TOKEN_FILE_BYTES = 4096


def read_token(path: Path) -> str:
    """The bearer token in ``path``.

    Raises :class:`ValueError` (the message says what is wrong) for an unreadable or empty file,
    a token with spaces, or a file another user could have written or can read.

    A token file must be a regular file owned by the server's user or root and accessible to
    its owner only (mode 600 or 400). Symlinks are resolved and their target checked the same
    way; the checked file is the one read (opened once, checked through its descriptor), so a
    link swapped in between cannot give another user's file.
    """
    try:
        target = path.resolve(strict=True)
        fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except (OSError, RuntimeError) as e:
        raise ValueError(f"cannot read it: {getattr(e, 'strerror', None) or e}") from None
    try:
        st = os.fstat(fd)
        name = str(path) if target == path.absolute() else f"{path} (a link to {target})"
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{name} is not a regular file")
        if st.st_uid not in (os.geteuid(), 0):
            raise ValueError(
                f"{name} is owned by uid {st.st_uid}, not by the server's user "
                f"(uid {os.geteuid()}) or root"
            )
        if st.st_mode & 0o077:
            raise ValueError(
                f"{name} is accessible to other users (mode {st.st_mode & 0o777:o}); chmod 600 it"
            )
        data = os.read(fd, MAX_TOKEN_FILE_BYTES + 1)
    except OSError as e:
        raise ValueError(f"cannot read it: {e.strerror}") from None
    finally:
        os.close(fd)
    if len(data) > MAX_TOKEN_FILE_BYTES:
        raise ValueError(f"it is longer than {MAX_TOKEN_FILE_BYTES} bytes")
    try:
        token = data.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise ValueError("it is not UTF-8 text") from None
    if not token or any(c.isspace() for c in token):
        raise ValueError("it must hold one token without spaces")
    return token


@dataclass(frozen=True)
class Limits:
    """Bounds on what clients may send; anything larger is refused with a 4xx naming the field.

    Attributes:
        max_body_bytes: largest REST request body except profile uploads (413 beyond).
        max_profile_bytes: largest ``PUT /jobs/{id}/profile`` body (413 beyond).
        max_stages: pipeline ranks per pipeline.
        max_microbatches: microbatches per iteration.
        max_virtual_stages: model chunks per rank (interleaved 1F1B).
        max_data_parallel: data-parallel pipelines per job.
        max_tensor_parallel: tensor-parallel degree.
        max_ranks: ``stages * data_parallel * tensor_parallel``.
        max_instructions: instructions in one pipeline iteration (DAG nodes).
        max_jobs: jobs stored at once.
        max_gpus: GPUs the stored jobs hold at once (the sum of their world sizes); tenants'
            default GPU quotas are shares of it.
        history_per_rank: iteration reports kept per rank (older ones are dropped).
        max_concurrent_solves: frontier computations running at once (more wait, ``queued``;
            a slot that frees goes to the tenants in turn, ``runtime/fair_slots.py``).
        max_report_instructions: instruction measurements in one ``IterationReport``.
        solve_memory_bytes: resident memory one frontier computation may use; over it, the
            computation fails naming this limit (the server and other solves go on).
        solve_seconds: wall time one frontier computation may take (idem).
        max_queued_solves: computations waiting for a worker at once (409 beyond; one per job);
            each tenant may have its share waiting, this divided by the number of tenants.
        max_jobs_page: most jobs one ``GET /jobs`` page lists.
        idle_after_seconds: a job with no connected rank for this long becomes ``idle`` and
            leaves the cluster power budget (``docs/power.md``).
        replan_dwell_seconds: the least time between two replans of one pipeline that its
            reported iteration times cause (detected, pace changed, recovered); events within
            it wait (operators' REST reports are never held back).
        profile_mismatch_band: the band ``(low, high)`` of measured / planned iteration time
            outside which a job's profile counts as wrong for it (``profile_mismatch``).
        profile_mismatch_iterations: the reported iterations (per pipeline, their median)
            the band is judged over.
        max_streams_per_credential: ``WatchPlan`` streams one credential holds at once (a rank
            holds one: a new stream for it replaces the old); more are refused with
            ``RESOURCE_EXHAUSTED``. The shared ``--token-file`` token counts as one credential.
        tenant_job_share: the most a tenant's default job and GPU quotas may be, as a fraction
            of ``max_jobs`` and ``max_gpus`` (not for the ``default`` tenant); the defaults are
            also equal parts of what explicit quotas leave, so they never over-commit the
            server (``service/tenants.py``); ``PATCH /tenants/{id}`` sets another.
        budget_recompute_seconds: the least time between two recomputations of the cluster
            power budget that jobs cause (ranks coming and going, lifecycles, straggler marks,
            re-solves, deletions: more within it are merged into one at its end).
        max_gpu_watts: what one GPU is taken to draw at most when nothing better is known of
            it (no registered power limit, a GPU the known-GPU table lacks, nothing measured):
            a job's claim on the power budget is bounded by it per GPU.
        tenant_write_rate: REST writes a tenant's credentials may make per second, sustained
            (429 with ``Retry-After`` beyond; 0: no limit; ``runtime/write_limits.py``).
        tenant_write_burst: the writes a tenant may make at once before the rate applies.
    """

    max_body_bytes: int = 4 * 1024 * 1024
    max_profile_bytes: int = 16 * 1024 * 1024
    max_stages: int = 128
    max_microbatches: int = 1024
    max_virtual_stages: int = 16
    max_data_parallel: int = 1024
    max_tensor_parallel: int = 64
    max_ranks: int = 65536
    max_instructions: int = 32_768
    max_jobs: int = 1000
    max_gpus: int = 65536
    history_per_rank: int = 256
    max_concurrent_solves: int = 4
    max_report_instructions: int = 100_000
    solve_memory_bytes: int = 2 * 1024**3
    solve_seconds: float = 3600.0
    max_queued_solves: int = 64
    max_jobs_page: int = 1000
    idle_after_seconds: float = 300.0
    replan_dwell_seconds: float = 5.0
    profile_mismatch_band: tuple[float, float] = (0.25, 4.0)
    profile_mismatch_iterations: int = 8
    max_streams_per_credential: int = 65536
    tenant_job_share: float = 0.25
    budget_recompute_seconds: float = 0.5
    max_gpu_watts: float = 1000.0
    tenant_write_rate: float = 20.0
    tenant_write_burst: int = 200


@dataclass(frozen=True)
class ZeusConfig:
    """Zeus's pipeline-frequency-optimizer routes under ``/zeus`` (``perseus serve --zeus``).

    Attributes:
        default_prototype: the prototype job (a name or an id, looked up in the caller's
            tenant) of a run whose ``job_metadata`` is empty; None: such a run is refused.
        plan_wait: the longest a rank's ``GET /zeus/schedule`` waits for its run's plan (s);
            past it, the rank gets the max-clock schedule and the run's status says why.
    """

    default_prototype: str | None = None
    plan_wait: float = 30.0


@dataclass(frozen=True)
class ServerConfig:
    """How ``perseus serve`` runs. Port 0 picks a free port (the real one is printed)."""

    host: str = "127.0.0.1"
    http_port: int = 8000
    grpc_port: int = 50051
    #: The store: a SQLite file (a path, or ``sqlite:///PATH``) or a PostgreSQL URL
    #: (``postgresql://USER@HOST/DB``); see :mod:`perseus_server.runtime.stores`.
    db_path: Path | str = Path("perseus.db")
    #: Seconds the PostgreSQL leader's lease lasts without renewal (a standby takes over after).
    leader_lease: float = 5.0
    #: With PostgreSQL: the host name or address other servers' standbys name as this server's
    #: when it leads (``None``: ``host``, or the machine's host name when ``host`` is every
    #: address); stored with its lease, with the ports it listens on.
    advertise: str | None = None
    token: str | None = None
    #: Where ``token`` and ``read_token`` were read from: read again on SIGHUP (rotation).
    token_file: Path | None = None
    read_token_file: Path | None = None
    #: A read-only credential (needs ``token``): REST ``GET``/``HEAD`` routes only.
    read_token: str | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    limits: Limits = field(default_factory=Limits)
    shutdown_grace: float = 2.0
    #: Seconds a connection may take to send its request headers (HTTP) or handshake (gRPC).
    header_timeout: float = 10.0
    #: Seconds a request's body may take to arrive after its headers (HTTP); slower, the
    #: connection is closed.
    body_timeout: float = 60.0
    #: Open connections per protocol at most (also bounded by the file-descriptor limit).
    max_connections: int = 8192
    #: Host names an open server (no token) answers besides loopback ones (DNS rebinding).
    allowed_hosts: tuple[str, ...] = ()
    #: Zeus's pipeline-frequency-optimizer routes (None: not mounted).
    zeus: ZeusConfig | None = None
