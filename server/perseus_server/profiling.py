"""Online profiling: the scan over SM frequencies that measures a job's own profile.

The server announces one frequency at a time (a plan version whose steps all run at that
clock, with a ``ProfilingTask``). Clients report every iteration; at each frequency the server
discards each rank's first ``warmup_iterations`` reports and keeps the next ``iterations``.
Once every registered rank has ``iterations`` measured reports (and every stage is covered), the
scan moves to the next lower frequency. It stops when the job's energy per iteration rose for
``stop_after_rises`` consecutive frequencies, or at the end of the list. The profile is the mean
time and energy of each (stage, instruction, frequency) over every measured instruction of every
rank (data-parallel replicas and tensor-parallel ranks are averaged: a per-GPU profile).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from perseus_server.states import ProfilingStatus

__all__ = ["ProfilingSession", "Measurement"]


@dataclass(frozen=True)
class Measurement:
    """One measured instruction from an ``IterationReport``."""

    instruction: str
    stage: int
    frequency: int
    time: float
    energy: float


@dataclass
class ProfilingSession:
    """Mutable state of one job's frequency scan (persisted at every frequency boundary)."""

    frequencies: list[int]
    warmup_iterations: int
    iterations: int
    stop_after_rises: int
    step: int = 0
    step_version: int = 0
    status: ProfilingStatus = ProfilingStatus.RUNNING
    error: str | None = None
    energies: list[float] = field(default_factory=list)  # job energy / iteration per finished step
    rises: int = 0
    sums: dict[tuple[int, str, int], list[float]] = field(
        default_factory=dict
    )  # -> [time, energy, n]
    # current step (not persisted: a restarted server measures the current frequency again)
    seen: dict[str, int] = field(default_factory=dict)
    measured: dict[str, int] = field(default_factory=dict)
    current: dict[tuple[int, str], list[float]] = field(default_factory=dict)
    rank_energy: dict[str, list[float]] = field(default_factory=dict)

    @property
    def frequency(self) -> int:
        return self.frequencies[self.step]

    def record(
        self,
        rank_id: str,
        plan_version: int,
        iteration_energy: float,
        measurements: list[Measurement],
    ) -> bool:
        """Account one report; returns True when it was kept as a measured iteration."""
        if self.status is not ProfilingStatus.RUNNING or plan_version != self.step_version:
            return False
        self.seen[rank_id] = self.seen.get(rank_id, 0) + 1
        if (
            self.seen[rank_id] <= self.warmup_iterations
            or self.measured.get(rank_id, 0) >= self.iterations
        ):
            return False
        f = self.frequency
        kept = [m for m in measurements if m.frequency in (0, f)]
        if not kept:
            return False
        self.measured[rank_id] = self.measured.get(rank_id, 0) + 1
        for m in kept:
            acc = self.current.setdefault((m.stage, m.instruction), [0.0, 0.0, 0.0])
            acc[0] += m.time
            acc[1] += m.energy
            acc[2] += 1
        e = iteration_energy if iteration_energy > 0 else sum(m.energy for m in kept)
        re = self.rank_energy.setdefault(rank_id, [0.0, 0.0])
        re[0] += e
        re[1] += 1
        return True

    def step_complete(self, ranks: set[str], stages: int) -> bool:
        if self.status is not ProfilingStatus.RUNNING or not ranks:
            return False
        if any(self.measured.get(r, 0) < self.iterations for r in ranks):
            return False
        return {s for s, _ in self.current} >= set(range(stages))

    def advance(self) -> bool:
        """Close the current frequency; returns True when the scan is over."""
        f = self.frequency
        energy = sum(s / n for s, n in self.rank_energy.values() if n)
        if self.energies and energy > self.energies[-1]:
            self.rises += 1
        else:
            self.rises = 0
        self.energies.append(energy)
        for (stage, kind), (t, e, n) in self.current.items():
            self.sums[(stage, kind, f)] = [t, e, n]
        self.seen, self.measured, self.current, self.rank_energy = {}, {}, {}, {}
        if self.rises >= self.stop_after_rises or self.step + 1 >= len(self.frequencies):
            return True
        self.step += 1
        return False

    def profile_csv(self) -> str:
        """The measured profile as ``stage,instruction,frequency,time,energy`` CSV."""
        lines = ["stage,instruction,frequency,time,energy"]
        for (stage, kind, f), (t, e, n) in sorted(
            self.sums.items(), key=lambda kv: (kv[0][0], kv[0][1], -kv[0][2])
        ):
            lines.append(f"{stage},{kind},{f},{t / n!r},{e / n!r}")
        return "\n".join(lines) + "\n"

    def progress(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "error": self.error,
            "frequencies": self.frequencies,
            "step": self.step,
            "current_frequency": self.frequency if self.status is ProfilingStatus.RUNNING else None,
            "plan_version": self.step_version,
            "warmup_iterations": self.warmup_iterations,
            "iterations_per_frequency": self.iterations,
            "stop_after_rises": self.stop_after_rises,
            "measured_iterations": dict(sorted(self.measured.items())),
            "energy_per_iteration": [
                {"frequency": f, "energy": e}
                for f, e in zip(self.frequencies, self.energies, strict=False)
            ],
            "consecutive_rises": self.rises,
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "frequencies": self.frequencies,
            "warmup_iterations": self.warmup_iterations,
            "iterations": self.iterations,
            "stop_after_rises": self.stop_after_rises,
            "step": self.step,
            "step_version": self.step_version,
            "status": self.status,
            "error": self.error,
            "energies": self.energies,
            "rises": self.rises,
            "sums": [[s, k, f, *v] for (s, k, f), v in self.sums.items()],
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> ProfilingSession:
        return cls(
            frequencies=[int(f) for f in doc["frequencies"]],
            warmup_iterations=int(doc["warmup_iterations"]),
            iterations=int(doc["iterations"]),
            stop_after_rises=int(doc["stop_after_rises"]),
            step=int(doc["step"]),
            step_version=int(doc["step_version"]),
            status=ProfilingStatus(doc["status"]),
            error=doc.get("error"),
            energies=[float(e) for e in doc["energies"]],
            rises=int(doc["rises"]),
            sums={
                (int(s), str(k), int(f)): [float(t), float(e), float(n)]
                for s, k, f, t, e, n in doc["sums"]
            },
        )
