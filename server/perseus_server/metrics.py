"""The server's Prometheus metrics: what it counts, and the job and tenant gauges it reads.

No global registry: the service owns one :class:`Metrics` and passes it where needed. The series
themselves (counters, gauges, histograms, label values bounded to the server's own, everything
else counted as ``other``) are :mod:`perseus_server.metric_series`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Protocol

from perseus_server.metric_series import (
    HTTP_METHODS,
    Counter,
    Gauge,
    Histogram,
    Labels,
    Registry,
    solve_buckets,
)

__all__ = ["TENANT_GAUGES", "JobEnergySource", "JobGaugeSource", "Metrics"]

_JOB_LABEL = re.compile(r'[{,]perseus_job="([^"]*)"')
_TENANT_LABEL = re.compile(r'[{,]tenant="([^"]*)"')


class JobEnergySource(Protocol):
    """What exports the jobs' measured power and energy saved.

    The service's measured-power part,
    :class:`perseus_server.service.measured_power.MeasuredPower`.
    """

    def powers(self) -> dict[Labels, float]:
        """``perseus_job_power_watts`` by job."""
        ...

    def savings(self) -> dict[Labels, float]:
        """``perseus_energy_saved_joules`` by job."""
        ...


class JobGaugeSource(Protocol):
    """What exports the jobs' sizes, lifecycles, power budget and deployed slowdowns.

    The service's :class:`perseus_server.service.job_gauges.JobGauges`.
    """

    def world_sizes(self) -> dict[Labels, float]:
        """``perseus_job_world_size`` by job."""
        ...

    def lifecycles(self) -> dict[Labels, float]:
        """``perseus_job_lifecycle`` by job and state."""
        ...

    def budget_watts(self) -> dict[Labels, float]:
        """``perseus_power_budget_watts``; empty when no budget is set."""
        ...

    def budget_feasible(self) -> dict[Labels, float]:
        """``perseus_power_budget_feasible``; empty when no budget is set."""
        ...

    def allocations(self) -> dict[Labels, float]:
        """``perseus_power_budget_allocation_watts`` by job."""
        ...

    def slowdowns(self) -> dict[Labels, float]:
        """``perseus_deployed_slowdown_ratio`` by job and pipeline."""
        ...

    def profile_mismatches(self) -> dict[Labels, float]:
        """``perseus_profile_mismatch`` by job."""
        ...

    def slow_links(self) -> dict[Labels, float]:
        """The slow-link gauges by job and link."""
        ...

    def job_infos(self) -> dict[Labels, float]:
        """``perseus_job_info``: 1 per job, labelled with its name and tenant."""
        ...

    def slowdown_ranges(self) -> dict[Labels, float]:
        """``perseus_job_deployed_slowdown_ratio`` by job and stat (min, max)."""
        ...

    def frontier_failures(self) -> dict[Labels, float]:
        """``perseus_job_frontier_failed`` by job."""
        ...

    def tenant_gauges(self, name: str) -> dict[Labels, float]:
        """The per-tenant gauge ``name`` (see :data:`TENANT_GAUGES`) by tenant."""
        ...


#: The per-tenant gauges: name -> help (read through ``JobGaugeSource.tenant_gauges(name)``).
TENANT_GAUGES = {
    "perseus_tenant_info": "1 per tenant (a team: a namespace, an account), by tenant.",
    "perseus_tenant_jobs": "Jobs a tenant holds, by tenant.",
    "perseus_tenant_quota_jobs": "A tenant's job quota, by tenant.",
    "perseus_tenant_gpus": "GPUs (world sizes) a tenant's jobs hold, by tenant.",
    "perseus_tenant_quota_gpus": "A tenant's GPU quota, by tenant (absent: none of its own).",
    "perseus_tenant_power_guaranteed_watts": "The watts of the cluster power budget a tenant is "
    "guaranteed, by tenant (with a budget set).",
    "perseus_tenant_power_demand_watts": "What a tenant's budget-drawing jobs can use at their "
    "fastest plans (W, claims bounded by their GPUs), by tenant (with a budget set).",
    "perseus_tenant_power_allocated_watts": "A tenant's share of the cluster power budget (W), "
    "by tenant (with a budget set).",
    "perseus_tenant_below_guaranteed_share": "1 while a tenant's share is below what it is "
    "guaranteed (the lesser of its guarantee and its demand), else 0 (with a budget set).",
    "perseus_tenant_power_budget_feasible": "1 while a tenant's drawing jobs fit in its part of "
    "the cluster power budget, 0 when even their least-power plans exceed it (the budget is "
    "unreachable through this tenant's jobs), by tenant (with a budget set).",
}

_LATENCY = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
    """Every metric the server exports; gauges read live state through callbacks."""

    def __init__(
        self,
        jobs: Callable[[], dict[Labels, float]],
        connected: Callable[[], dict[Labels, float]],
        registered: Callable[[], dict[Labels, float]],
        solve_limit: float = 3600.0,
        job_energy: JobEnergySource | None = None,
        without_clock_control: Callable[[], dict[Labels, float]] | None = None,
    ) -> None:
        """Build the registry and its gauges' sources.

        ``jobs`` (by state), ``connected`` and ``registered`` ranks (by job), ``job_energy``
        (measured power and energy saved; None: those gauges are empty).
        """
        self.registry = Registry()
        r = self.registry
        self.started = time.time()
        #: The leadership epoch while this server leads an active/standby pair (None: alone).
        self.leader_epoch: int | None = None
        self._add_leadership(r)
        #: The per-job gauges' source (:meth:`add_job_gauges`); read at every scrape.
        self.job_gauges: JobGaugeSource | None = None
        r.add(
            Gauge(
                "perseus_start_time_seconds",
                "When this server process started (Unix time, s); process-local figures "
                "(perseus_energy_saved_joules) count from here.",
                lambda: {(): self.started},
            )
        )
        self.jobs = r.add(Gauge("perseus_jobs", "Jobs stored, by state.", jobs))
        self.registered_ranks = r.add(
            Gauge("perseus_registered_ranks", "Ranks registered, by job.", registered)
        )
        self.connected_ranks = r.add(
            Gauge(
                "perseus_connected_ranks",
                "Ranks with an open WatchPlan stream, by job (every job, 0 included).",
                connected,
            )
        )
        self._job_gauge(
            "perseus_job_world_size", "Ranks a job expects (its world size), by job.", "world_sizes"
        )
        self._job_gauge(
            "perseus_job_lifecycle",
            "A job's lifecycle: 1 for its state (active, idle, finished), 0 for the others.",
            "lifecycles",
        )
        self._job_gauge(
            "perseus_power_budget_watts",
            "The cluster power budget (W); absent when none is set.",
            "budget_watts",
        )
        self._job_gauge(
            "perseus_power_budget_feasible",
            "1 when the cluster power budget is met, 0 when the covered jobs cannot get under "
            "it (its on_infeasible policy runs); absent when none is set.",
            "budget_feasible",
        )
        self._job_gauge(
            "perseus_power_budget_allocation_watts",
            "Each active covered job's share of the cluster power budget (W, whole job).",
            "allocations",
        )
        self._job_gauge(
            "perseus_job_info",
            "1 per job, labelled with its name and tenant: join other series on perseus_job "
            "(the Perseus job id; Prometheus's own job label is the scrape's).",
            "job_infos",
        )
        self._job_gauge(
            "perseus_deployed_slowdown_ratio",
            "The deployed plan of a job's slowest pipelines (at most 8 per job): its iteration "
            "time over the max-clock time, minus 1 (0.05 = 5 % slower), by job and pipeline.",
            "slowdowns",
        )
        self._job_gauge(
            "perseus_job_deployed_slowdown_ratio",
            "The least (stat=min) and greatest (stat=max) deployed slowdown over a job's "
            "pipelines, by job.",
            "slowdown_ranges",
        )
        self._job_gauge(
            "perseus_job_frontier_failed",
            "1 while a job's latest frontier computation failed (not cancelled), else 0; one "
            "that succeeds clears it.",
            "frontier_failures",
        )
        for name, help in TENANT_GAUGES.items():
            self._tenant_gauge(name, help)
        self._job_gauge(
            "perseus_profile_mismatch",
            "1 when a job's measured iteration times are outside the band around its plan's "
            "prediction (its energy-saved figures are withheld, straggler replanning paused).",
            "profile_mismatches",
        )
        self._job_gauge(
            "perseus_slow_link",
            "1 per slow link: a stage boundary whose measured transfer time grew past its "
            "baseline (the profile's, or its first measured window), by job, pipeline, boundary "
            "(between stage b and b + 1) and direction (forward, backward).",
            "slow_links",
        )
        self.ranks_without_clock_control = r.add(
            Gauge(
                "perseus_ranks_without_clock_control",
                "Registered ranks that say they cannot control their GPU's clocks (they train at "
                "the GPU's current clocks), by job and node (their host name; the 32 nodes "
                'with most per job, the rest as other; node="" 0 when none lacks control).',
                without_clock_control or dict,
            )
        )
        self._add_activity(r, solve_limit, job_energy)

    def _add_leadership(self, r: Registry) -> None:
        """``perseus_leader`` (1: this server serves) and its epoch. Part of :meth:`__init__`.

        A standby answers ``/metrics`` itself (:mod:`perseus_server.standby`), with 0.
        """
        r.add(
            Gauge(
                "perseus_leader",
                "1 on the server that serves (a single server, or the leader of an "
                "active/standby pair); a standby answers its own page with 0.",
                lambda: {(): 1.0},
            )
        )
        r.add(
            Gauge(
                "perseus_leader_epoch",
                "The leadership epoch this server leads in (absent on a single server).",
                lambda: {} if self.leader_epoch is None else {(): float(self.leader_epoch)},
            )
        )

    def _add_activity(
        self, r: Registry, solve_limit: float, job_energy: JobEnergySource | None
    ) -> None:
        """The counters and histograms of what the server does, and the measured-power gauges.

        What the server does: solves, deployments, requests, reports. Part of
        :meth:`__init__`.
        """
        self.solves: Counter = r.add(
            Counter("perseus_solves_total", "Frontier computations finished, by outcome.")
        )  # type: ignore[assignment]
        self.solve_seconds: Histogram = r.add(
            Histogram(
                "perseus_solve_seconds",
                "Wall time of frontier computations.",
                solve_buckets(solve_limit),
            )
        )  # type: ignore[assignment]
        self.stage_resolve_seconds: Histogram = r.add(
            Histogram(
                "perseus_stage_resolve_seconds",
                "Solver time of frontiers re-solved for a pipeline with slow stages.",
                (0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
            )
        )  # type: ignore[assignment]
        self.deploys: Counter = r.add(
            Counter("perseus_plan_deployments_total", "Plan versions deployed, by job and kind.")
        )  # type: ignore[assignment]
        self.replans: Counter = r.add(
            Counter("perseus_replans_total", "Straggler replanning decisions, by job and reason.")
        )  # type: ignore[assignment]
        self.push_latency: Histogram = r.add(
            Histogram(
                "perseus_push_latency_seconds",
                "Time from a plan deployment until a stream has written it.",
                _LATENCY,
            )
        )  # type: ignore[assignment]
        self.request_latency: Histogram = r.add(
            Histogram(
                "perseus_request_latency_seconds",
                "REST request latency, by route and method.",
                _LATENCY,
            )
        )  # type: ignore[assignment]
        self.requests: Counter = r.add(
            Counter("perseus_requests_total", "REST requests, by route, method and status.")
        )  # type: ignore[assignment]
        self.request_latency.restrict(method=HTTP_METHODS)
        self.requests.restrict(method=HTTP_METHODS, status=(str(c) for c in range(100, 600)))
        self.reports: Counter = r.add(
            Counter("perseus_iteration_reports_total", "Iteration reports accepted over gRPC.")
        )  # type: ignore[assignment]
        self.grpc_calls: Counter = r.add(
            Counter("perseus_grpc_calls_total", "gRPC calls, by method and code.")
        )  # type: ignore[assignment]
        self.refusals: Counter = r.add(
            Counter(
                "perseus_refusals_total",
                "Requests refused for a tenant's credential or job, by tenant and reason "
                "(job_quota, gpu_quota, forbidden, not_found, power_claim_clipped, "
                "rate_limited, solve_queue).",
            )
        )  # type: ignore[assignment]
        self.budget_recomputations: Counter = r.add(
            Counter(
                "perseus_power_budget_recomputations_total",
                "Recomputations of the cluster power budget (changes within "
                "budget_recompute_seconds of the last are merged into one).",
            )
        )  # type: ignore[assignment]
        self.internal_errors: Counter = r.add(
            Counter(
                "perseus_internal_errors_total",
                "Unexpected exceptions answered as 500 problem bodies (a bug when nonzero).",
            )
        )  # type: ignore[assignment]
        self.store_errors: Counter = r.add(
            Counter(
                "perseus_store_errors_total",
                "Writes the store refused, by kind (disk_full: answered 503 / UNAVAILABLE, "
                "retried by the client; nothing acknowledged is lost).",
            )
        )  # type: ignore[assignment]
        self.duplicate_reports: Counter = r.add(
            Counter(
                "perseus_duplicate_reports_total",
                "Iteration reports acknowledged and dropped as re-sent (same rank and sequence).",
            )
        )  # type: ignore[assignment]
        #: The service's measured-power part; read at every scrape.
        self.job_energy = job_energy
        r.add(
            Gauge(
                "perseus_job_power_watts",
                "Measured average power of the job's current plan version (W, whole job).",
                lambda: self.job_energy.powers() if self.job_energy is not None else {},
            )
        )
        r.add(
            Gauge(
                "perseus_energy_saved_joules",
                "Energy saved against the same iterations at max clocks (J, whole job, net; "
                "since perseus_start_time_seconds; withheld for a job with a profile mismatch).",
                lambda: self.job_energy.savings() if self.job_energy is not None else {},
            )
        )

        self.off_plan_instructions: Counter = r.add(
            Counter(
                "perseus_off_plan_instructions_total",
                "Instructions that ran more than one clock step below their locked clock, by job, "
                "global rank and clock-event reasons (joined by +; none: no reason given).",
            )
        )  # type: ignore[assignment]

    def _job_gauge(self, name: str, help: str, method: str) -> None:
        def read() -> dict[Labels, float]:
            src = self.job_gauges
            return {} if src is None else dict(getattr(src, method)())

        self.registry.add(Gauge(name, help, read))

    def _tenant_gauge(self, name: str, help: str) -> None:
        def read() -> dict[Labels, float]:
            src = self.job_gauges
            return {} if src is None else dict(src.tenant_gauges(name))

        self.registry.add(Gauge(name, help, read))

    def add_job_gauges(self, source: JobGaugeSource) -> None:
        """Read the per-job gauges from ``source``.

        The gauges: lifecycle, budget, mismatch, slowdown, world size. ``source`` is the
        service's :class:`~perseus_server.service.job_gauges.JobGauges`, built after this
        registry since it reads the service's parts.
        """
        self.job_gauges = source

    def drop_job(self, job_id: str) -> None:
        """Forget a deleted job's counter series."""
        for counter in (self.replans, self.deploys, self.off_plan_instructions):
            counter.drop(perseus_job=job_id)

    def render(self) -> str:
        """Every metric in the Prometheus text format."""
        return self.registry.render()

    def render_for(self, jobs: set[str], tenant: str) -> str:
        """What one tenant's credential sees: the samples of its ``jobs`` and ``tenant`` only.

        A sample with neither label, a cluster-wide one, is left out.
        """
        out = []
        for line in self.render().splitlines():
            if line.startswith("#"):
                out.append(line)
                continue
            job = _JOB_LABEL.search(line)
            owner = _TENANT_LABEL.search(line)
            if (job is not None and job.group(1) in jobs) or (
                job is None and owner is not None and owner.group(1) == tenant
            ):
                out.append(line)
        return "\n".join(out) + "\n"
