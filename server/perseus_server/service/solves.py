"""A job's frontier computation: started, followed, cancelled, and deployed when done.

Started in a worker process (see :mod:`perseus_server.runtime.solve_manager`), followed, cancelled,
and deployed when it is done.

The partial frontier: when the job has no frontier of the profile revision being solved, the
solver's first plan (a verified zero-slowdown plan) is stored as the job's frontier, one point,
status ``partial``, and deployed (a plan version), in one transaction, while the rest is
computed; plan queries are answered from it (marked ``partial``). The whole frontier then
replaces it and the deployment is re-decided on it in one transaction (the policy and pins set
meanwhile are kept), so no deployment points past the stored frontier. A solve that fails or is
cancelled after its first plan leaves that plan stored and deployed (it is a real plan, no
slower than all maximum clocks): the frontier stays ``partial`` with the failure as its error.

Solves resumed (active/standby on one database): a solve is acknowledged once its frontier row
says ``queued``, and that row, the job's profile, schedule and blocking power are all it needs.
A new leader starts every solve the store still shows active (queued, running or partial) again
from the stored profile (:meth:`Solves.resume`), so a solve the old leader acknowledged and did
not finish is finished by the new one, without the job asking again; a partial frontier stays
deployed meanwhile. A leader that stops cleanly leaves its solves as stored for the next one
instead of marking them failed.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from perseus.frontier import Frontier
from perseus_server.decisions.planner import PlanPolicy
from perseus_server.domain.errors import Conflict
from perseus_server.domain.states import ProfilingStatus, SolveStatus
from perseus_server.runtime.faults import fault_point
from perseus_server.runtime.solve_manager import SolveEvents
from perseus_server.service.context import ServiceContext
from perseus_server.service.deployment import Deployer, require_frontier
from perseus_server.service.state import Job

__all__ = ["Solves", "decode_frontier"]

log = logging.getLogger("perseus.server")


def decode_frontier(doc: str) -> Frontier:
    """A solver's result document as a frontier (run off the event loop, see ``SolveEvents``)."""
    return Frontier.from_json(json.loads(doc))


class Solves:
    """Frontier computations of jobs' profiles."""

    def __init__(self, ctx: ServiceContext, deployer: Deployer) -> None:
        self.ctx = ctx
        self.deployer = deployer
        #: Solves stopped by this server's shutdown stay active in the store, for the next
        #: leader to resume (set by :meth:`resume`).
        self.hand_over = False

    def resume(self, job_ids: list[str]) -> None:
        """Start again the solves of ``job_ids`` that a previous leader acknowledged.

        They start from their stored profiles. From now on, this server's own solves cut short
        by its stop are left to the next leader likewise. Called while the event loop runs
        (the solves start on it once it is free).
        """
        self.hand_over = True
        for job_id in job_ids:
            job = self.ctx.jobs.get(job_id)
            if job.profile.current is None:  # cannot happen through the API; said, not hidden
                row = job.frontier.row
                row.status, row.finished = SolveStatus.FAILED, time.time()
                row.error = "interrupted, and the job has no profile to solve again"
                self.ctx.store.put_frontier(job_id, row)
                continue
            log.info("job %s: resuming the frontier computation a previous leader began", job_id)
            self.launch(job, resumed=True)

    def start(self, job_id: str) -> dict[str, Any]:
        """``POST /jobs/{id}/frontier``: start computing the job's frontier; returns its status.

        Refused with 409 when the job has no profile, or a computation (or online profiling)
        is under way.
        """
        job = self.ctx.jobs.get(job_id)
        if job.profile.current is None:
            raise Conflict(
                "the job has no profile yet; PUT /jobs/{id}/profile first", field="profile"
            )
        if self.ctx.solver.is_active(job_id):
            raise Conflict(
                "a frontier computation is already running for this job", field="frontier"
            )
        if job.profiling_is(ProfilingStatus.RUNNING):
            raise Conflict(
                "online profiling is running; the frontier is computed when it ends",
                field="frontier",
            )
        if self.ctx.solver.queue_full():
            raise Conflict(
                f"{self.ctx.solver.limits.max_queued} frontier computations are already waiting "
                "for a worker (max_queued_solves); retry later",
                field="frontier",
            )
        self.launch(job)
        return self.status(job_id, points=False)

    def launch(self, job: Job, *, resumed: bool = False) -> None:
        """Solve the job's current profile; deploy the fastest plan when it is done.

        ``resumed``: the solve is one a previous leader began (see :meth:`resume`); a first
        plan it stored and deployed counts as this solve's.
        """
        profile = job.profile.current
        assert profile is not None
        ctx, row = self.ctx, job.frontier.row
        revision = job.profile.revision
        # A first plan helps only where no frontier of this profile revision is stored yet.
        wants_first = job.frontier.current is None or row.profile_revision != revision
        had_first = resumed and row.partial and not wants_first
        row.status, row.progress, row.error = SolveStatus.QUEUED, 0.0, None
        row.started, row.finished = time.time(), None
        ctx.store.put_frontier(job.id, row)
        t0 = time.perf_counter()
        first: list[bool] = [had_first]  # this solve's first plan is stored and deployed

        def alive() -> bool:
            return job.id in ctx.jobs

        def on_running(pid: int) -> None:
            if alive():
                row.status = SolveStatus.RUNNING
                ctx.store.put_frontier(job.id, row)

        def on_progress(fraction: float) -> None:
            row.progress = max(row.progress, min(1.0, fraction))  # stored at the end

        def on_first_plan(doc: str, frontier: Frontier) -> None:
            if not alive() or row.status is not SolveStatus.RUNNING:
                return
            # The partial frontier and its deployment: one transaction, as on completion.
            with ctx.store.transaction():
                row.status, row.doc, row.partial = SolveStatus.PARTIAL, doc, True
                row.profile_revision = revision
                ctx.store.put_frontier(job.id, row)
                fault_point("after_partial_store")
                job.frontier.set(frontier)
                job.deployment.policy, job.deployment.overrides = PlanPolicy(), {}
                self.deployer.decide(
                    job, "first plan (the rest of the frontier is being computed)", force=True
                )
            first[0] = True
            fault_point("after_partial_commit")
            log.info("job %s: first plan deployed; the rest of the frontier follows", job.id)

        def on_done(doc: str, seconds: float, frontier: Frontier) -> None:
            if not alive():
                return
            # Frontier, profiling state and the deployment they lead to: one transaction, so a
            # crash leaves either none of them or all (never a deployment past the frontier).
            with ctx.store.transaction():
                row.status, row.progress, row.error, row.doc = SolveStatus.DONE, 1.0, None, doc
                row.finished, row.solve_seconds = time.time(), seconds
                row.profile_revision, row.partial = revision, False
                ctx.store.put_frontier(job.id, row)
                fault_point("after_frontier_store")
                job.frontier.set(frontier)
                if job.profiling is not None and job.profiling.status is ProfilingStatus.SOLVING:
                    job.profiling.status = ProfilingStatus.DONE
                    ctx.store.put_profiling(job.id, job.profiling.to_json())
                if not first[0]:
                    # Default policy after a solve: the fastest plan (point 0), deployed at once.
                    job.deployment.policy, job.deployment.overrides = PlanPolicy(), {}
                # After a first plan, the policy and pins of the partial phase are kept (a pin
                # there is to point 0, the fastest plan here too) and re-decided on the whole
                # frontier. Always a new version, even with the same indices: the plans behind
                # them changed with the frontier.
                cause = "frontier computed" + (" (replaces the first plan)" if first[0] else "")
                self.deployer.decide(job, cause, force=True)
            fault_point("after_solve_commit")
            ctx.metrics.solves.inc(outcome="done")
            ctx.metrics.solve_seconds.observe(time.perf_counter() - t0)

        def on_failed(reason: str) -> None:
            if not alive():
                return
            if self.hand_over and ctx.solver.stopping:
                log.info("job %s: solve stopped with the server; left to the next leader", job.id)
                return
            row.status, row.error, row.finished = SolveStatus.FAILED, reason, time.time()
            ctx.store.put_frontier(job.id, row)
            ctx.metrics.solves.inc(outcome="cancelled" if "cancel" in reason else "failed")
            log.warning("job %s: frontier computation failed: %s", job.id, reason)
            if job.profiling is not None and job.profiling.status is ProfilingStatus.SOLVING:
                job.profiling.status = ProfilingStatus.FAILED
                job.profiling.error = f"solving the measured profile failed: {reason}"
                ctx.store.put_profiling(job.id, job.profiling.to_json())

        ctx.solver.start(
            job.id,
            profile.to_csv(),
            job.schedule.to_json(),
            job.spec.blocking_power,
            SolveEvents(
                on_running,
                on_progress,
                on_done,
                on_failed,
                decode_frontier,
                on_first_plan if wants_first else None,
            ),
        )

    def cancel(self, job_id: str) -> dict[str, Any]:
        """Cancel the job's frontier computation; returns its status (409 when none runs)."""
        self.ctx.jobs.get(job_id)
        if not self.ctx.solver.cancel(job_id, "cancelled by request"):
            raise Conflict("no frontier computation is running for this job", field="frontier")
        return self.status(job_id, points=False)

    def status(self, job_id: str, *, points: bool = True) -> dict[str, Any]:
        """The computation's status and, once computed and with ``points``, every frontier point."""
        job = self.ctx.jobs.get(job_id)
        row, f = job.frontier.row, job.frontier.current
        out: dict[str, Any] = {
            "status": row.status,
            "progress": row.progress,
            "error": row.error,
            "started": row.started,
            "finished": row.finished,
            "solve_seconds": row.solve_seconds,
            "worker_pid": self.ctx.solver.worker_pid(job_id),
            "stale": f is not None and row.profile_revision != job.profile.revision,
        }
        if f is not None:
            out.update(
                num_points=len(f),
                max_frequency_time=f.max_frequency_time,
                max_frequency_energy=f.max_frequency_energy,
            )
            if row.partial:
                out["partial"] = True
            if points:
                out["points"] = [
                    {"index": i, "time": float(t), "energy": float(e), "lower_bound": float(lb)}
                    for i, (t, e, lb) in enumerate(
                        zip(f.times, f.energies, f.lower_bounds, strict=True)
                    )
                ]
        return out

    def frontier_of(self, job_id: str) -> tuple[Frontier, list[int]]:
        """The job's frontier and the indices its pipelines run (none unless plans run)."""
        job = self.ctx.jobs.get(job_id)
        frontier = require_frontier(job)
        dep = job.deployment.plan
        return frontier, list(dep.indices) if dep is not None else []
