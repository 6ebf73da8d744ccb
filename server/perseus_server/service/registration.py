"""Ranks joining their job (``RegisterRank``) and watching its plans (``WatchPlan``).

Registering the same ``(job, global_rank)`` again returns the same identity; a rank's
position (pipeline, data, tensor rank) is fixed once registered and no two ranks share one.
"""

from __future__ import annotations

import math
import secrets

from perseus_common.clocks import MAX_CLOCK_MHZ
from perseus_common.wire.values import PlanUpdate, RankRegistration, RegisteredRank
from perseus_server.domain.bounds import MAX_GPU_NAME, MAX_HOSTNAME, MAX_SUPPORTED_CLOCKS
from perseus_server.domain.errors import BadRequest, Conflict
from perseus_server.domain.jobs import RankInfo
from perseus_server.runtime.hub import Subscriber
from perseus_server.service.budget_draw import pipeline_width
from perseus_server.service.context import ServiceContext
from perseus_server.service.deployment import Deployer
from perseus_server.service.job_profiles import check_clocks
from perseus_server.service.lifecycle import Lifecycle
from perseus_server.service.report_checks import validate_clock_control
from perseus_server.service.state import Job

__all__ = ["Registration", "MAX_POWER_W"]

#: The largest maximum power limit a rank may register (W; one GPU draws far less).
MAX_POWER_W = 10_000


def _validate(job: Job, req: RankRegistration) -> tuple[int, ...]:
    """Check the request's fields against the job; returns its clocks, fastest first."""
    spec = job.spec
    checks = (
        ("global_rank", req.global_rank, spec.world_size),
        ("pipeline_rank", req.pipeline_rank, spec.stages),
        ("data_rank", req.data_rank, spec.data_parallel),
        ("tensor_rank", req.tensor_rank, spec.tensor_parallel),
    )
    for name, value, n in checks:
        if not (0 <= value < n):
            raise BadRequest(f"must be between 0 and {n - 1} for this job, got {value}", field=name)
    clocks = tuple(sorted({int(c) for c in req.supported_clocks_mhz}, reverse=True))
    if any(c <= 0 or c > MAX_CLOCK_MHZ for c in clocks) or len(clocks) > MAX_SUPPORTED_CLOCKS:
        raise BadRequest(
            f"clocks must be 1..{MAX_SUPPORTED_CLOCKS} positive MHz values",
            field="supported_clocks_mhz",
        )
    if not (math.isfinite(req.max_power_limit_w) and 0 <= req.max_power_limit_w <= MAX_POWER_W):
        raise BadRequest(
            f"must be a number of watts in [0, {MAX_POWER_W}] (0: unknown), got "
            f"{req.max_power_limit_w!r}",
            field="max_power_limit_w",
        )
    for field, text, most in (
        ("gpu_name", req.gpu_name, MAX_GPU_NAME),
        ("hostname", req.hostname, MAX_HOSTNAME),
    ):
        if len(text) > most:
            raise BadRequest(f"at most {most} characters, got {len(text)}", field=field)
    validate_clock_control("registration", req.clock_control, req.clock_control_reason)
    return clocks


def _check_slot(job: Job, req: RankRegistration, existing: RankInfo | None) -> None:
    slot = (req.pipeline_rank, req.data_rank, req.tensor_rank)
    if (
        existing is not None
        and (existing.pipeline_rank, existing.data_rank, existing.tensor_rank) != slot
    ):
        raise Conflict(
            f"global_rank {req.global_rank} is registered as "
            f"pipeline_rank={existing.pipeline_rank} "
            f"data_rank={existing.data_rank} tensor_rank={existing.tensor_rank}",
            field="global_rank",
        )
    for r in job.ranks.by_global.values():
        if (
            r.global_rank != req.global_rank
            and (r.pipeline_rank, r.data_rank, r.tensor_rank) == slot
        ):
            raise Conflict(
                f"pipeline_rank/data_rank/tensor_rank {slot} is taken by "
                f"global_rank {r.global_rank}",
                field="global_rank",
            )


class Registration:
    """Rank registration and plan subscriptions."""

    def __init__(self, ctx: ServiceContext, deployer: Deployer, lifecycle: Lifecycle) -> None:
        """Set up rank registration.

        ``lifecycle``: told when a rank's plan stream opens and closes (a job with no open
        stream goes idle).
        """
        self.ctx = ctx
        self.deployer = deployer
        self.lifecycle = lifecycle

    def register(self, req: RankRegistration) -> RegisteredRank:
        """``RegisterRank``: check the registration and store the rank in its job's slot.

        Returns what the rank needs to follow plans; a malformed registration is refused
        naming the field.
        """
        job = self.ctx.jobs.get(req.job_id)
        clocks = _validate(job, req)
        existing = job.ranks.by_global.get(req.global_rank)
        _check_slot(job, req, existing)
        rank = RankInfo(
            job_id=job.id,
            rank_id=existing.rank_id
            if existing
            else f"{job.id}-{req.global_rank}-{secrets.token_hex(4)}",
            global_rank=req.global_rank,
            pipeline_rank=req.pipeline_rank,
            data_rank=req.data_rank,
            tensor_rank=req.tensor_rank,
            gpu_name=req.gpu_name,
            supported_clocks=clocks,
            hostname=req.hostname,
            max_power_limit_w=float(req.max_power_limit_w),
        )
        profile = job.profile.current
        if profile is not None and clocks:
            try:
                check_clocks(job, profile, [rank])
            except BadRequest as e:
                raise BadRequest(e.detail, field="supported_clocks_mhz") from None
        if rank != existing:
            self.ctx.store.put_rank(rank)
        job.ranks.add(rank)
        width = pipeline_width(job)
        if existing is None and job.ranks.per_pipeline.get(rank.data_rank) == width:
            # A pipeline that can run: the job draws on a budget for it now.
            self.lifecycle.registered(
                job.id, f"pipeline {rank.data_rank} has all its {width} ranks connected"
            )
        elif existing is not None and existing.max_power_limit_w != rank.max_power_limit_w:
            self.lifecycle.registered(job.id, f"rank {rank.global_rank}'s power limit changed")
        if req.clock_control:
            job.ranks.clock_control[rank.rank_id] = (req.clock_control, req.clock_control_reason)
        max_clock = clocks[0] if clocks else (profile.frequencies[0] if profile is not None else 0)
        return RegisteredRank(
            rank_id=rank.rank_id,
            plan_version=job.deployment.version if job.deployment.current is not None else 0,
            stages=job.spec.stages,
            microbatches=job.spec.microbatches,
            max_clock_mhz=max_clock,
        )

    def subscribe(
        self, job_id: str, rank_id: str, credential: str = ""
    ) -> tuple[Subscriber, PlanUpdate | None]:
        """Open a plan stream for the rank; returns it and the current plan (None: none yet).

        The rank's open stream, if any, ends (a rank holds one); ``credential`` (who opens it)
        may hold ``Limits.max_streams_per_credential`` streams in all
        (:class:`~perseus_server.runtime.hub.StreamLimitExceeded` beyond).
        """
        job = self.ctx.jobs.get(job_id)
        rank = job.ranks.by_id.get(rank_id)
        if rank is None:
            raise Conflict(
                f"rank {rank_id!r} is not registered in job {job_id}; call RegisterRank first",
                field="rank_id",
            )
        sub = self.ctx.hub.subscribe(rank, credential)
        self.lifecycle.connected(job_id, rank_id)
        return sub, self.deployer.message(job, rank)

    def unsubscribe(self, sub: Subscriber) -> None:
        """End a plan stream; the job's lifecycle hears that a rank disconnected."""
        self.ctx.hub.unsubscribe(sub)
        self.lifecycle.disconnected(sub.rank.job_id)
