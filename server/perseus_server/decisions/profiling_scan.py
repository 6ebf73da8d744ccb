"""Online profiling: the scan over SM frequencies that measures a job's own profile.

**Protocol.** The server announces one frequency at a time (a plan version whose steps all run
at that clock, with a ``ProfilingTask``). Clients report every iteration; at each frequency the
server discards each rank's first ``warmup_iterations`` reports and keeps at most the next
``iterations``. The profile is the mean time and energy of each (stage, instruction, frequency)
over every measured instruction of every rank (data-parallel replicas and tensor-parallel ranks
are averaged: a per-GPU profile).

**What the frontier needs.** The solver weighs an option of an instruction by its time and its
*effective cost* ``c = energy - P_b * time`` (``P_b``: the blocking power a waiting GPU draws),
and keeps only options no other option of the same instruction beats in both. As the clock
falls, time rises; so once ``c`` is above the lowest value measured so far (the instruction's
*valley*), every lower clock is dominated by the valley's clock unless ``c`` falls below the
valley again. The job's energy per iteration at a uniform clock says nothing about that: it
rises (the critical path slows, every rank waits longer) well before the clocks that a frontier
gives to non-critical instructions stop paying off. The scan therefore follows each
(stage, instruction) on its own.

**Noise.** At each clock every measured instruction is one sample of its (stage, instruction)
(microbatches, iterations, replicas). The session keeps, per (stage, instruction, clock), the
sums of time, energy, their squares and their product, so the sample variance of ``c`` (for any
``P_b``: ``var e + P_b^2 var t - 2 P_b cov(t, e)``) and the standard error of its mean
``se = sqrt(var / n)`` follow. A clock counts as a *real rise* of an instruction when
``c - c_valley > noise_sigmas * sqrt(se^2 + se_valley^2)``: a rise within the noise does not
count, and a clock that is not a real rise resets the count (and becomes the valley when it is
lower). With fewer than two samples the noise is taken as zero. Rises before the cost has
really fallen below the highest clock's do not count: a GPU that cannot sustain its highest
clocks under load (its power limit caps them) measures a flat or rising cost there, and the
valley lies further down.

**Stopping.** An instruction is past its valley after ``stop_after_rises`` consecutive real
rises. The scan stops when every measured (stage, instruction) is past its valley, or at the end
of the list. ``P_b`` is the job's blocking power, or the one measured so far when larger (a
larger ``P_b`` moves every valley to a lower clock, so the scan only goes further).

**Cost.** A clock is finished once every rank has at least one measured iteration, every stage
is covered, and either every rank has ``iterations`` measured iterations, or every
(stage, instruction)'s mean time and energy are known within ``tolerance`` (relative standard
error, from at least two samples): stable measurements are not repeated. ``tolerance=0``
measures ``iterations`` iterations at every clock (and a revisit, below, always does).
:attr:`ProfilingSession.iterations_spent`
counts the job's iterations over the finished clocks (the most reports of any one rank at each,
warm-up included).

**The fastest clocks.** The zero-slowdown plan runs the critical path at the highest clock
and gives a critical instruction a lower clock only where that clock is as fast: a clock whose
mean time reads, by noise, no slower than the highest clock's while it draws less energy is
taken, and the plan is truly late. The scan therefore ends by measuring clocks again (at most
``max_revisits`` revisits, ``iterations`` iterations each after the warm-up), chosen by
:func:`perseus_server.decisions.profiling_revisits.next_revisit`: the fastest clocks while their times
cannot be told apart within ``top_tolerance``, and, with a ``cost_tolerance`` (off unless
given), every clock whose effective cost is within the noise of being some price's choice. Its
samples add to the scan's. ``tolerance=0`` measures nothing again.

**Smoothing.** :meth:`ProfilingSession.profile_csv` gives mean energies, and mean times smoothed
across clocks by :func:`perseus_server.decisions.profile_fit.smooth_curve` (adaptive local quadratic fits
that pool neighbouring clocks only while their estimates agree within the noise; a curve
without a noise estimate is left as measured); the same smoothed times and their standard
errors decide the revisits. Energies are not smoothed: an energy curve's clock-to-clock
features are what a frontier exploits, and pooling them loses more than the noise it removes.

**Blocking power.** A report that carries its rank's iteration time and energy (and the energy
of every instruction) tells how much energy the rank drew outside its instructions and for how
long: ``(iteration energy - sum of instruction energies) / (iteration time - sum of instruction
times)`` pooled over a clock's reports is that clock's estimate
(:attr:`ProfilingSession.blocking_powers`), pooled over every clock
:attr:`ProfilingSession.measured_blocking_power`; both are stored with the session.

The job's energy per iteration (summed over the ranks' means) is still recorded at every clock
for the progress report; ``rises`` counts its consecutive rises (the rule earlier versions
stopped on).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from perseus_server.decisions.link_fit import TransferSamples
from perseus_server.decisions.profile_fit import smooth_curve
from perseus_server.decisions.profiling_revisits import Curve, next_revisit
from perseus_server.domain.states import ProfilingStatus

__all__ = [
    "ProfilingSession",
    "Measurement",
    "InstructionStats",
    "DEFAULT_TOLERANCE",
    "DEFAULT_MAX_REVISITS",
]

#: The relative standard error at which a clock's means are known (the REST default).
DEFAULT_TOLERANCE = 0.01
#: The most clocks the server measures again after the scan (see *The fastest clocks*).
DEFAULT_MAX_REVISITS = 12

#: Accumulator layout: sum t, sum e, n, sum t^2, sum e^2, sum t*e.
_T, _E, _N, _TT, _EE, _TE = range(6)


@dataclass(frozen=True)
class Measurement:
    """One measured instruction from an ``IterationReport``."""

    instruction: str
    stage: int
    frequency: int
    time: float
    energy: float


@dataclass(frozen=True)
class InstructionStats:
    """Means and standard errors of one (stage, instruction) at one clock."""

    n: int
    time: float
    energy: float
    time_se: float
    energy_se: float
    #: effective cost ``energy - P_b * time`` and its standard error, for the given ``P_b``
    cost: float
    cost_se: float

    @classmethod
    def of(cls, acc: list[float], blocking_power: float) -> InstructionStats:
        """From an accumulator (``[t, e, n]``, or ``[t, e, n, tt, ee, te]`` with squares)."""
        n = acc[_N]
        t, e = acc[_T] / n, acc[_E] / n
        var_t = var_e = cov = 0.0
        if n >= 2 and len(acc) > _TE:
            var_t = max(0.0, (acc[_TT] - n * t * t) / (n - 1))
            var_e = max(0.0, (acc[_EE] - n * e * e) / (n - 1))
            cov = (acc[_TE] - n * t * e) / (n - 1)
        var_c = max(0.0, var_e + blocking_power**2 * var_t - 2 * blocking_power * cov)
        return cls(
            n=int(n),
            time=t,
            energy=e,
            time_se=math.sqrt(var_t / n),
            energy_se=math.sqrt(var_e / n),
            cost=e - blocking_power * t,
            cost_se=math.sqrt(var_c / n),
        )

    def known_within(self, tolerance: float) -> bool:
        """Whether mean time and energy have a relative standard error within ``tolerance``."""
        return (
            self.n >= 2
            and self.time_se <= tolerance * abs(self.time)
            and self.energy_se <= tolerance * abs(self.energy)
        )


def _real_rises(points: list[InstructionStats], sigmas: float) -> int:
    """Consecutive real rises above the valley at the end of ``points`` (fastest clock first).

    None count before the cost has really fallen below the first clock's.
    """
    if not points:
        return 0
    first = valley = points[0]
    fallen = False
    count = 0
    for p in points[1:]:
        fallen = fallen or first.cost - p.cost > sigmas * math.hypot(p.cost_se, first.cost_se)
        if fallen and p.cost - valley.cost > sigmas * math.hypot(p.cost_se, valley.cost_se):
            count += 1
        else:
            count = 0
            if p.cost < valley.cost:
                valley = p
    return count


@dataclass
class ProfilingSession:
    """Mutable state of one job's frequency scan (persisted at every frequency boundary).

    Args:
        frequencies: the clocks to scan, highest first.
        warmup_iterations: reports discarded per rank at each clock.
        iterations: the most measured iterations per rank at each clock.
        stop_after_rises: consecutive real rises of an instruction's effective cost after which
            it is past its valley (see the module docstring); the scan stops when every
            instruction is.
        blocking_power: the job's blocking power (watts) for the effective cost.
        tolerance: relative standard error at which a clock's means are known (0: always
            measure ``iterations``).
        noise_sigmas: how many standard errors a rise must exceed to be real.
        top_tolerance: relative standard error to which the fastest clocks' times are
            measured (see the module docstring, *The fastest clocks*; 0: times not measured again).
        max_revisits: the most clocks measured again after the scan.
        smooth: whether :meth:`profile_csv` gives the times smoothed across clocks.
        cost_tolerance: standard error, relative to the energy, below which two clocks' close
            effective costs count as told apart (see
            :mod:`perseus_server.decisions.profiling_revisits`; 0: effective costs measured once).
    """

    frequencies: list[int]
    warmup_iterations: int
    iterations: int
    stop_after_rises: int
    step: int = 0
    step_version: int = 0
    status: ProfilingStatus = ProfilingStatus.RUNNING
    error: str | None = None
    energies: list[float] = field(default_factory=list)  # job energy / iteration per finished step
    rises: int = 0  # consecutive rises of the job's energy per iteration
    sums: dict[tuple[int, str, int], list[float]] = field(
        default_factory=dict
    )  # -> [t, e, n, tt, ee, te] (or [t, e, n] from sessions stored before the squares were)
    blocking_power: float = 0.0
    tolerance: float = DEFAULT_TOLERANCE
    noise_sigmas: float = 3.0
    #: per finished step: [energy outside instructions (J), time outside instructions (s)]
    waits: list[list[float]] = field(default_factory=list)
    iterations_spent: int = 0
    top_tolerance: float = 0.001
    max_revisits: int = 0
    smooth: bool = True
    cost_tolerance: float = 0.0
    #: the clock being measured again after the scan (``None``: scanning ``frequencies``)
    revisit: int | None = None
    #: the clocks measured again so far, in order
    revisited: list[int] = field(default_factory=list)
    #: per-report P2P transfer times per link and clock (see :mod:`.link_fit`)
    transfers: TransferSamples = field(default_factory=TransferSamples)
    # current step (not persisted: a restarted server measures the current frequency again)
    seen: dict[str, int] = field(default_factory=dict)
    measured: dict[str, int] = field(default_factory=dict)
    current: dict[tuple[int, str], list[float]] = field(default_factory=dict)
    rank_energy: dict[str, list[float]] = field(default_factory=dict)
    current_wait: list[float] = field(default_factory=lambda: [0.0, 0.0])

    @property
    def frequency(self) -> int:
        """The clock being measured."""
        return self.revisit if self.revisit is not None else self.frequencies[self.step]

    # -- measurements -----------------------------------------------------------------------------

    def record(
        self,
        rank_id: str,
        plan_version: int,
        iteration_energy: float,
        measurements: list[Measurement],
        iteration_time: float = 0.0,
        transfers: Mapping[tuple[int, str], float] | None = None,
    ) -> bool:
        """Account one report; returns True when it was kept as a measured iteration.

        ``iteration_time`` (the rank's, 0 when unknown) with a measured ``iteration_energy``
        adds to the blocking-power estimate. ``transfers``: the link times the report completes
        (:class:`~perseus_server.decisions.link_fit.LinkCombiner`), kept with a kept iteration.
        """
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
        if transfers:
            self.transfers.add(f, transfers)
        for m in kept:
            acc = self.current.setdefault((m.stage, m.instruction), [0.0] * 6)
            t, e = float(m.time), float(m.energy)
            acc[_T] += t
            acc[_E] += e
            acc[_N] += 1
            acc[_TT] += t * t
            acc[_EE] += e * e
            acc[_TE] += t * e
        busy_e = sum(float(m.energy) for m in kept)
        e = iteration_energy if iteration_energy > 0 else busy_e
        re = self.rank_energy.setdefault(rank_id, [0.0, 0.0])
        re[0] += e
        re[1] += 1
        if (
            iteration_time > 0
            and iteration_energy > 0
            and len(kept) == len(measurements)
            and all(m.energy > 0 for m in kept)
        ):
            wait = iteration_time - sum(float(m.time) for m in kept)
            if wait > 0:
                self.current_wait[0] += iteration_energy - busy_e
                self.current_wait[1] += wait
        return True

    def step_complete(self, ranks: set[str], stages: int) -> bool:
        """Whether the current clock is measured (see the module docstring, *Cost*)."""
        if self.status is not ProfilingStatus.RUNNING or not ranks:
            return False
        if any(self.measured.get(r, 0) < 1 for r in ranks):
            return False
        if not {s for s, _ in self.current} >= set(range(stages)):
            return False
        if all(self.measured.get(r, 0) >= self.iterations for r in ranks):
            return True
        return (
            self.revisit is None
            and self.tolerance > 0
            and all(
                InstructionStats.of(acc, 0.0).known_within(self.tolerance)
                for acc in self.current.values()
            )
        )

    def advance(self) -> bool:
        """Close the current clock; returns True when the scan is over.

        The scan is the descending scan and then the re-measuring of the fastest clocks (see
        the module docstring).
        """
        f = self.frequency
        self.iterations_spent += max(self.seen.values(), default=0)
        if self.revisit is not None:
            for (stage, kind), acc in self.current.items():
                old = self.sums.get((stage, kind, f))
                if old is None or len(old) <= _TE:
                    self.sums[(stage, kind, f)] = list(acc) if old is None else old
                else:
                    self.sums[(stage, kind, f)] = [a + b for a, b in zip(old, acc, strict=True)]
            w = self.waits[self.frequencies.index(f)]
            w[0] += self.current_wait[0]
            w[1] += self.current_wait[1]
            self.revisited.append(f)
            self._reset_step()
            return self._start_revisit()
        energy = sum(s / n for s, n in self.rank_energy.values() if n)
        if self.energies and energy > self.energies[-1]:
            self.rises += 1
        else:
            self.rises = 0
        self.energies.append(energy)
        self.waits.append(list(self.current_wait))
        for (stage, kind), acc in self.current.items():
            self.sums[(stage, kind, f)] = list(acc)
        self._reset_step()
        if self.step + 1 >= len(self.frequencies):
            return self._start_revisit()
        rises = self.instruction_rises()
        if rises and min(rises.values()) >= self.stop_after_rises:
            return self._start_revisit()
        self.step += 1
        return False

    def _reset_step(self) -> None:
        self.seen, self.measured, self.current, self.rank_energy = {}, {}, {}, {}
        self.current_wait = [0.0, 0.0]

    def _start_revisit(self) -> bool:
        """Pick the next clock to measure again; True when there is none (the scan is over)."""
        self.revisit = None
        if self.tolerance <= 0 or len(self.revisited) >= self.max_revisits:
            return True
        self.revisit = next_revisit(
            list(self._curves(smooth=self.smooth).values()),
            sigmas=self.noise_sigmas,
            top_tolerance=self.top_tolerance,
            cost_tolerance=self.cost_tolerance,
        )
        return self.revisit is None

    # -- what was measured ------------------------------------------------------------------------

    @property
    def blocking_powers(self) -> list[float | None]:
        """The blocking power measured at each finished clock (W; ``None`` where unmeasured)."""
        return [e / t if t > 0 else None for e, t in self.waits]

    @property
    def measured_blocking_power(self) -> float | None:
        """The blocking power pooled over every finished clock (W), or ``None``."""
        e = sum(w[0] for w in self.waits)
        t = sum(w[1] for w in self.waits)
        return e / t if t > 0 else None

    @property
    def effective_blocking_power(self) -> float:
        """The ``P_b`` of the effective cost: the job's, or the measured one when larger."""
        return max(self.blocking_power, self.measured_blocking_power or 0.0)

    def stats(self) -> dict[tuple[int, str], list[tuple[int, InstructionStats]]]:
        """Per (stage, instruction): ``(frequency, stats)`` of every finished clock.

        In scan order.
        """
        pb = self.effective_blocking_power
        order = {f: i for i, f in enumerate(self.frequencies[: len(self.energies)])}
        out: dict[tuple[int, str], list[tuple[int, InstructionStats]]] = {}
        for (stage, kind, f), acc in sorted(
            self.sums.items(), key=lambda kv: order.get(kv[0][2], -1)
        ):
            if f in order and acc[_N] > 0:
                out.setdefault((stage, kind), []).append((f, InstructionStats.of(acc, pb)))
        return out

    def instruction_rises(self) -> dict[tuple[int, str], int]:
        """Per (stage, instruction): its consecutive real rises at the last finished clock."""
        return {
            key: _real_rises([s for _, s in points], self.noise_sigmas)
            for key, points in self.stats().items()
        }

    def _curves(self, *, smooth: bool) -> dict[tuple[int, str], Curve]:
        """Per (stage, instruction): its curve over every finished clock (highest first).

        Times are smoothed across clocks when ``smooth`` (the costs then use the smoothed
        times).
        """
        pb = self.effective_blocking_power
        out = {}
        for key, points in self.stats().items():
            points = sorted(points, key=lambda p: -p[0])
            freqs = np.array([f for f, _ in points], dtype=np.int64)
            t = np.array([p.time for _, p in points])
            t_se = np.array([p.time_se for _, p in points])
            e = np.array([p.energy for _, p in points])
            c_se = np.array([p.cost_se for _, p in points])
            if smooth:
                t, t_se = smooth_curve(freqs, t, t_se)
            out[key] = Curve(freqs, t, t_se, e, e - pb * t, c_se)
        return out

    def profile_csv(self, *, raw: bool = False) -> str:
        """The measured profile as ``stage,instruction,frequency,time,energy`` CSV.

        Mean energies, and mean times smoothed across clocks (unless ``raw`` or the
        session's ``smooth`` is off; see :mod:`perseus_server.decisions.profile_fit`).
        """
        lines = ["stage,instruction,frequency,time,energy"]
        for (stage, kind), c in sorted(self._curves(smooth=self.smooth and not raw).items()):
            for f, ti, ei in zip(c.frequencies, c.time, c.energy, strict=True):
                lines.append(f"{stage},{kind},{int(f)},{float(ti)!r},{float(ei)!r}")
        return "\n".join(lines) + "\n"

    def progress(self) -> dict[str, Any]:
        """The scan's progress (keys fixed by the REST model).

        ``consecutive_rises`` is the fewest consecutive real rises of any instruction (the
        scan stops at ``stop_after_rises``).
        """
        rises = self.instruction_rises() if self.energies else {}
        return {
            "status": self.status,
            "error": self.error,
            "frequencies": self.frequencies,
            "step": self.frequencies.index(self.frequency),
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
            "consecutive_rises": min(rises.values(), default=0),
        }

    # -- persistence ------------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """The session as stored: its settings and every clock's measurements."""
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
            "blocking_power": self.blocking_power,
            "tolerance": self.tolerance,
            "noise_sigmas": self.noise_sigmas,
            "waits": self.waits,
            "measured_blocking_power": self.measured_blocking_power,
            "iterations_spent": self.iterations_spent,
            "top_tolerance": self.top_tolerance,
            "max_revisits": self.max_revisits,
            "smooth": self.smooth,
            "cost_tolerance": self.cost_tolerance,
            "revisit": self.revisit,
            "revisited": self.revisited,
            "transfers": self.transfers.to_json(),
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> ProfilingSession:
        """Read :meth:`to_json`'s document, or one stored before the noise-aware scan.

        An older document has no squares (zero noise) and no tolerance (every clock measures
        ``iterations``).
        """
        energies = [float(e) for e in doc["energies"]]
        waits = [[float(e), float(t)] for e, t in doc.get("waits", [])]
        waits += [[0.0, 0.0] for _ in range(len(energies) - len(waits))]
        return cls(
            frequencies=[int(f) for f in doc["frequencies"]],
            warmup_iterations=int(doc["warmup_iterations"]),
            iterations=int(doc["iterations"]),
            stop_after_rises=int(doc["stop_after_rises"]),
            step=int(doc["step"]),
            step_version=int(doc["step_version"]),
            status=ProfilingStatus(doc["status"]),
            error=doc.get("error"),
            energies=energies,
            rises=int(doc["rises"]),
            sums={(int(s), str(k), int(f)): [float(x) for x in v] for s, k, f, *v in doc["sums"]},
            blocking_power=float(doc.get("blocking_power", 0.0)),
            tolerance=float(doc.get("tolerance", 0.0)),
            noise_sigmas=float(doc.get("noise_sigmas", 3.0)),
            waits=waits,
            iterations_spent=int(doc.get("iterations_spent", 0)),
            # sessions stored before re-measuring and smoothing: neither
            top_tolerance=float(doc.get("top_tolerance", 0.0)),
            max_revisits=int(doc.get("max_revisits", 0)),
            smooth=bool(doc.get("smooth", False)),
            cost_tolerance=float(doc.get("cost_tolerance", 0.0)),
            revisit=None if doc.get("revisit") is None else int(doc["revisit"]),
            revisited=[int(f) for f in doc.get("revisited", [])],
            transfers=TransferSamples.from_json(doc.get("transfers")),
        )
