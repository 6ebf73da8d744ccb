"""A small Prometheus text-format registry (counters, gauges, histograms with labels).

No global registry: the service owns one :class:`Metrics` and passes it where needed.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from typing import Protocol

__all__ = ["Counter", "Gauge", "Histogram", "JobEnergySource", "Metrics", "Registry"]

Labels = tuple[tuple[str, str], ...]


class JobEnergySource(Protocol):
    """What exports the jobs' measured power and energy saved (the service's measured-power
    part, :class:`perseus_server.service.measured_power.MeasuredPower`)."""

    def powers(self) -> dict[Labels, float]: ...

    def savings(self) -> dict[Labels, float]: ...


def _fmt_labels(labels: Labels, extra: Labels = ()) -> str:
    items = labels + extra
    if not items:
        return ""
    esc = [
        f'{k}="{str(v).replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34)).replace(chr(10), " ")}"'
        for k, v in items
    ]
    return "{" + ",".join(esc) + "}"


def _fmt_value(v: float) -> str:
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v)) if not float(v).is_integer() else str(int(v))


class Counter:
    """A monotonically increasing value per label set."""

    kind = "counter"

    def __init__(self, name: str, help: str) -> None:
        self.name, self.help = name, help
        self.values: dict[Labels, float] = {}

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        self.values[key] = self.values.get(key, 0.0) + amount

    def drop(self, **labels: str) -> None:
        """Forget every series whose labels include ``labels`` (``O(series)``)."""
        want = set(labels.items())
        for key in [k for k in self.values if want <= set(k)]:
            del self.values[key]

    def render(self) -> list[str]:
        return [
            f"{self.name}{_fmt_labels(k)} {_fmt_value(v)}" for k, v in sorted(self.values.items())
        ]


class Gauge:
    """A value that goes up and down; either set explicitly or read from a callback."""

    kind = "gauge"

    def __init__(
        self, name: str, help: str, read: Callable[[], dict[Labels, float]] | None = None
    ) -> None:
        self.name, self.help, self._read = name, help, read
        self.values: dict[Labels, float] = {}

    def set(self, value: float, **labels: str) -> None:
        self.values[tuple(sorted(labels.items()))] = value

    def render(self) -> list[str]:
        values = self._read() if self._read is not None else self.values
        return [f"{self.name}{_fmt_labels(k)} {_fmt_value(v)}" for k, v in sorted(values.items())]


class Histogram:
    """Cumulative buckets, sum and count per label set."""

    kind = "histogram"

    def __init__(self, name: str, help: str, buckets: Sequence[float]) -> None:
        self.name, self.help = name, help
        self.buckets = sorted(buckets)
        self.series: dict[Labels, list[float]] = {}  # per label set: bucket counts..., sum, count

    def observe(self, value: float, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        s = self.series.get(key)
        if s is None:
            s = self.series[key] = [0.0] * (len(self.buckets) + 2)
        i = bisect.bisect_left(self.buckets, value)
        if i < len(self.buckets):
            s[i] += 1
        s[-2] += value
        s[-1] += 1

    def render(self) -> list[str]:
        out = []
        for key, s in sorted(self.series.items()):
            acc = 0.0
            for b, c in zip(self.buckets, s[: len(self.buckets)], strict=True):
                acc += c
                out.append(
                    f"{self.name}_bucket{_fmt_labels(key, (('le', _fmt_value(b)),))} {_fmt_value(acc)}"
                )
            out.append(
                f"{self.name}_bucket{_fmt_labels(key, (('le', '+Inf'),))} {_fmt_value(s[-1])}"
            )
            out.append(f"{self.name}_sum{_fmt_labels(key)} {_fmt_value(s[-2])}")
            out.append(f"{self.name}_count{_fmt_labels(key)} {_fmt_value(s[-1])}")
        return out


class Registry:
    """An ordered set of metrics rendered together."""

    def __init__(self) -> None:
        self._metrics: list[Counter | Gauge | Histogram] = []

    def add(self, metric: Counter | Gauge | Histogram) -> Counter | Gauge | Histogram:
        self._metrics.append(metric)
        return metric

    def render(self) -> str:
        lines = []
        for m in self._metrics:
            lines.append(f"# HELP {m.name} {m.help}")
            lines.append(f"# TYPE {m.name} {m.kind}")
            lines.extend(m.render())
        return "\n".join(lines) + "\n"


_LATENCY = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
    """Every metric the server exports; gauges read live state through callbacks."""

    def __init__(
        self,
        jobs: Callable[[], dict[Labels, float]],
        connected: Callable[[], dict[Labels, float]],
        registered: Callable[[], dict[Labels, float]],
        without_clock_control: Callable[[], dict[Labels, float]] | None = None,
    ) -> None:
        self.registry = Registry()
        r = self.registry
        self.jobs = r.add(Gauge("perseus_jobs", "Jobs stored, by state.", jobs))
        self.registered_ranks = r.add(
            Gauge("perseus_registered_ranks", "Ranks registered, by job.", registered)
        )
        self.connected_ranks = r.add(
            Gauge(
                "perseus_connected_ranks", "Ranks with an open WatchPlan stream, by job.", connected
            )
        )
        self.ranks_without_clock_control = r.add(
            Gauge(
                "perseus_ranks_without_clock_control",
                "Registered ranks that say they cannot control their GPU's clocks (they train at "
                "the GPU's current clocks), by job.",
                without_clock_control or dict,
            )
        )
        self.solves: Counter = r.add(
            Counter("perseus_solves_total", "Frontier computations finished, by outcome.")
        )  # type: ignore[assignment]
        self.solve_seconds: Histogram = r.add(
            Histogram(
                "perseus_solve_seconds",
                "Wall time of frontier computations.",
                (0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800),
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
            Counter("perseus_plan_deployments_total", "Plan versions deployed, by cause.")
        )  # type: ignore[assignment]
        self.replans: Counter = r.add(
            Counter("perseus_replans_total", "Straggler replanning decisions, by kind.")
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
        self.reports: Counter = r.add(
            Counter("perseus_iteration_reports_total", "Iteration reports accepted over gRPC.")
        )  # type: ignore[assignment]
        self.grpc_calls: Counter = r.add(
            Counter("perseus_grpc_calls_total", "gRPC calls, by method and code.")
        )  # type: ignore[assignment]
        self.internal_errors: Counter = r.add(
            Counter(
                "perseus_internal_errors_total",
                "Unexpected exceptions answered as 500 problem bodies (a bug when nonzero).",
            )
        )  # type: ignore[assignment]
        self.duplicate_reports: Counter = r.add(
            Counter(
                "perseus_duplicate_reports_total",
                "Iteration reports acknowledged and dropped as re-sent (same rank and sequence).",
            )
        )  # type: ignore[assignment]
        #: Set by the service's measured-power part on first use; read at every scrape.
        self.job_energy: JobEnergySource | None = None
        r.add(
            Gauge(
                "perseus_job_power_watts",
                "Measured average power of the job's current plan version (W, whole job).",
                lambda: self.job_energy.powers() if self.job_energy is not None else {},
            )
        )
        r.add(
            Gauge(
                "perseus_energy_saved_joules_total",
                "Energy saved against the same iterations at max clocks (J, whole job, net; "
                "since the server started).",
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

    def render(self) -> str:
        return self.registry.render()
