"""A simulated GPU: a DVFS model driven by a Perseus profile.

An instruction run at SM clock ``f`` takes the profile's time at ``f`` (times ``slowdown``) and
consumes the profile's energy at ``f`` (times ``slowdown``: a throttled GPU draws the same power
for longer); between instructions the GPU waits and draws ``blocking_power`` watts. The energy
counter (:meth:`SimulatedGpu.energy_mj`) reads like NVML's: cumulative millijoules.

Time is scaled for demos and tests: with ``time_scale=s`` an instruction modelled to last ``t``
seconds occupies ``s*t`` seconds of wall time (the client sleeps at the end of the instruction
until then), and :meth:`SimulatedGpu.timestamp` returns simulated seconds (wall time / ``s``
between instructions; ``t`` per instruction, the sleep's overshoot is not counted), so times
reported to the server are on the profile's time axis.

That holds only while the real work inside an instruction (the training step's own Python and
torch code) takes less than its scaled time ``s*t``. When it takes longer, the instruction lasts
what it really took (divided by ``s``), so measured times rise above the model; the GPU then
warns once, naming the instruction and both times, and counts such instructions in
:attr:`SimulatedGpu.overruns`. **Choosing** ``time_scale``: make ``s * t_min`` (``t_min``: the
shortest instruction time in the profile, at the highest clock) at least a few times the real
work of one instruction, and at least ~10 ms, so that the OS's sleep overshoot (~0.1 ms, which a
neighbouring rank still sees as waiting) stays below 1 %. With ``time_scale=0`` nothing sleeps and
the clock only advances by instruction durations (idle time is not modelled), which is what the
hook-overhead benchmark uses.

The clock that decides an instruction's duration is the one in effect when
:meth:`begin_instruction` runs; the client applies the plan's clock before that for this backend
(``synchronous_clocks = True``). With ``state_path`` set, every lock/reset is persisted to a JSON
file (``{"locked_clock_mhz": int|null, "sets": n, "resets": n}``) so that another process can check
that the clocks were reset, e.g. after the training process received SIGTERM.

Stragglers and slow links are injected at runtime (:meth:`set_time_factor`,
:meth:`set_transfer_time`): see :mod:`perseus_client.gpu.simulated_injection`.

Throttling: :meth:`SimulatedGpu.throttle` caps the clock the GPU applies, as a power cap or a
thermal slowdown caps a real one: ``gpu.throttle(1005, reasons=("sw_thermal_slowdown",))`` makes
every following instruction run at ``min(locked clock, 1005 MHz)`` (its time and energy follow
that clock) and makes :meth:`sample_applied_clock` report it with those NVML clock-event reasons
(while the cap binds); ``gpu.throttle(None)`` lifts it. The client's applied-clock sampler sees
such instructions as off-plan (see :mod:`perseus_client.gpu.applied`).

Measurement noise: with ``noise=r`` (a relative standard deviation, e.g. ``0.015``) every
executed instruction's time and energy are each multiplied by an independent draw of
``max(0, 1 + r * N(0, 1))``, from a generator seeded with ``seed`` (the same seed gives the same
draws); ``energy_noise`` gives the energy a standard deviation of its own (energy counters are
typically noisier than instruction timings). :meth:`instruction_cost` stays the noiseless model.
``noise=0`` (the default) is exact.

Build one from a profile CSV (no numpy/scipy needed; the CSV is read with the standard library)::

    gpu = SimulatedGpu.from_profile_csv("profiles/gpt3-175b_a100-sxm_8stage.csv", stage=3,
                                        blocking_power=83.64, time_scale=0.05)

or from a loaded :class:`perseus.profiles.Profile` with :meth:`SimulatedGpu.from_profile`, or from
plain dicts ``{(stage, kind): {mhz: (seconds, joules)}}``.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import random
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from perseus_client.errors import ConfigError, UnsupportedClockError
from perseus_client.gpu.base import GpuBackend, hold_briefly
from perseus_client.gpu.curves import (
    Curve,
    Measurements,
    profile_measurements,
    read_profile_csv,
)
from perseus_client.gpu.nvml import CLOCK_EVENT_REASONS
from perseus_client.gpu.simulated_floor import FloorModel
from perseus_client.gpu.simulated_injection import Injection, deprecated_slowdown
from perseus_common.gpus import known_gpu_for

log = logging.getLogger("perseus_client.gpu")

__all__ = ["SimulatedGpu", "Measurements", "read_profile_csv"]


class SimulatedGpu(Injection, GpuBackend):
    """A GPU whose instruction times and energies follow a profile (see the module docstring).

    Args:
        measurements: ``{(stage, kind): {mhz: (seconds, joules)}}`` for the stage(s) this GPU runs.
        stage: the stage used when an instruction names none (default: the lowest stage present).
        blocking_power: watts drawn while waiting between instructions.
        time_scale: wall seconds per simulated second (0: never sleep).
        time_factor: how many times longer than profiled each instruction takes (1.0 = as
            profiled; 1.2 = 20 % slower).
        slowdown: deprecated name of ``time_factor`` (it took a factor, not a fraction).
        supported_clocks: the clocks this GPU accepts (default: every profiled frequency).
        state_path: persist lock/reset state to this JSON file on every change.
        name: device name reported at registration.
        max_power_limit_w: the GPU's maximum power limit (W) it reports (default: the known-GPU
            table's for a ``name`` naming a known GPU, e.g. ``"A100"``; otherwise none).
        noise: relative standard deviation of each executed instruction's time and energy
            (0: exact; see the module docstring).
        energy_noise: relative standard deviation of the energy (default: ``noise``).
        seed: seed of the noise's random generator (``None``: unseeded).
    """

    synchronous_clocks = True

    def __init__(
        self,
        measurements: Measurements,
        *,
        stage: int | None = None,
        blocking_power: float = 0.0,
        time_scale: float = 1.0,
        time_factor: float = 1.0,
        slowdown: float | None = None,
        supported_clocks: Sequence[int] | None = None,
        state_path: str | Path | None = None,
        name: str = "simulated",
        max_power_limit_w: float | None = None,
        noise: float = 0.0,
        energy_noise: float | None = None,
        seed: int | None = None,
        transfer_times: Mapping[tuple[int, str], float] | None = None,
    ) -> None:
        if not measurements:
            raise ConfigError("measurements", "must hold at least one (stage, kind) entry")
        if not (math.isfinite(blocking_power) and blocking_power >= 0):
            raise ConfigError("blocking_power", f"must be >= 0 watts, got {blocking_power}")
        if not (math.isfinite(time_scale) and time_scale >= 0):
            raise ConfigError("time_scale", f"must be >= 0, got {time_scale}")
        for what, value in (("noise", noise), ("energy_noise", energy_noise)):
            if value is not None and not (math.isfinite(value) and 0 <= value < 1):
                raise ConfigError(
                    what, f"must be a relative standard deviation in [0, 1), got {value}"
                )
        self.noise = float(noise)
        self.energy_noise = self.noise if energy_noise is None else float(energy_noise)
        self._rng = random.Random(seed)
        self._curves = {(int(s), str(k)): Curve(pts) for (s, k), pts in measurements.items()}
        stages = sorted({s for s, _ in self._curves})
        if stage is not None and stage not in stages:
            raise ConfigError(
                "stage", f"stage {stage} is not in the profile data (stages {stages})"
            )
        self.stage = stages[0] if stage is None else int(stage)
        self.stages = tuple(stages)
        self.name = name
        if max_power_limit_w is not None and not (
            math.isfinite(max_power_limit_w) and max_power_limit_w > 0
        ):
            raise ConfigError("max_power_limit_w", f"must be > 0 watts, got {max_power_limit_w}")
        known = known_gpu_for(name)
        self._max_power = (
            float(max_power_limit_w)
            if max_power_limit_w is not None
            else (known.max_power_limit if known is not None else None)
        )
        self.blocking_power = float(blocking_power)
        self.time_scale = float(time_scale)
        clocks = supported_clocks or sorted({f for c in self._curves.values() for f in c.freqs})
        self._clocks = tuple(sorted({int(c) for c in clocks}, reverse=True))
        self._time_factor = 1.0
        if slowdown is not None:
            deprecated_slowdown()
            time_factor = slowdown
        self.set_time_factor(time_factor)
        #: Instructions whose real work took longer than their scaled time (see the module doc).
        self.overruns = 0
        self._state_path = Path(state_path) if state_path is not None else None
        self._state_lock = threading.RLock()
        self._writes = itertools.count()
        self._locked: int | None = None
        self._cap: tuple[int, frozenset[str]] | None = None  # see throttle()
        self.sets = 0
        self.resets = 0
        # Time/energy accounting (simulated seconds / joules).
        self._wall_base = time.perf_counter()  # simulated time = _sim_base + wall since _wall_base
        self._sim_base = 0.0
        self._virtual = 0.0  # simulated time when time_scale == 0
        self._busy = 0.0  # simulated seconds spent in finished instructions
        self._energy = 0.0  # joules of finished instructions
        self._pending: tuple[float, float, float, float] | None = None
        self._pending_what: tuple[str, int, int | None] = ("", 0, None)
        self._pending_applied: tuple[int, frozenset[str]] | None = None
        self._transfers: dict[tuple[int, str], float] = {}
        #: The power floor (``set_power_floor``) and what it added (:mod:`.simulated_floor`).
        self.floor = FloorModel(self.blocking_power)
        for (b, d), t in (transfer_times or {}).items():
            self.set_transfer_time(b, d, t)
        self._persist()

    # -- construction ---------------------------------------------------------------------------

    @classmethod
    def from_profile_csv(
        cls, source: str | Path, *, stage: int, stages: Iterable[int] | None = None, **kwargs: Any
    ) -> SimulatedGpu:
        """Build from a profile CSV file (or CSV text): the data of ``stages`` (default ``[stage]``)."""
        data = read_profile_csv(source, stages=[stage] if stages is None else stages)
        return cls(data, stage=stage, **kwargs)

    @classmethod
    def from_profile(
        cls, profile: Any, *, stage: int, stages: Iterable[int] | None = None, **kwargs: Any
    ) -> SimulatedGpu:
        """Build from a :class:`perseus.profiles.Profile` (duck-typed: ``profile.entries``)."""
        data = profile_measurements(profile, [stage] if stages is None else stages)
        return cls(data, stage=stage, **kwargs)

    # -- GpuBackend -------------------------------------------------------------------------------

    def supported_clocks(self) -> tuple[int, ...]:
        """Supported SM clocks (MHz), highest first: the profile's."""
        return self._clocks

    def max_power_limit_w(self) -> float | None:
        """The maximum power limit (W): the one given, else the known GPU's; ``None`` if neither."""
        return self._max_power

    @property
    def locked_clock(self) -> int | None:
        """The locked SM clock in MHz, or ``None`` when not locked."""
        return self._locked

    @property
    def current_clock(self) -> int:
        """The clock instructions run at now.

        The locked clock (else the maximum), capped by :meth:`throttle`.
        """
        clock = self._clocks[0] if self._locked is None else self._locked
        cap = self._cap
        return clock if cap is None else min(clock, cap[0])

    def throttle(
        self, max_mhz: int | None, reasons: Iterable[str] = ("sw_thermal_slowdown",)
    ) -> None:
        """Cap the applied clock at ``max_mhz`` MHz, reported with NVML clock-event ``reasons``.

        The reasons are names of :data:`~perseus_client.gpu.nvml.CLOCK_EVENT_REASONS`;
        ``None`` lifts the cap. Thread-safe; takes effect from the next instruction.
        """
        if max_mhz is None:
            self._cap = None
            return
        names = frozenset(str(r) for r in reasons)
        unknown = sorted(names - set(CLOCK_EVENT_REASONS.values()))
        if unknown:
            raise ConfigError(
                "reasons",
                f"unknown clock-event reason(s) {unknown}; known: "
                f"{', '.join(CLOCK_EVENT_REASONS.values())}",
            )
        if not (isinstance(max_mhz, int) and max_mhz > 0):
            raise ConfigError("max_mhz", f"must be a positive number of MHz, got {max_mhz!r}")
        self._cap = (max_mhz, names)

    def sample_applied_clock(self) -> tuple[int, frozenset[str]] | None:
        """The clock the running instruction was modelled at (else the clock now).

        With the throttle's reasons while its cap binds.
        """
        applied = self._pending_applied
        if applied is not None and self._pending is not None:
            return applied
        return self._applied_now()

    def read_clock(self) -> tuple[int, frozenset[str]]:
        """The clock instructions run at now, with the throttle's reasons while its cap binds.

        The lock, else the maximum, capped by :meth:`throttle`.
        """
        return self._applied_now()

    def _applied_now(self) -> tuple[int, frozenset[str]]:
        locked = self._clocks[0] if self._locked is None else self._locked
        cap = self._cap
        if cap is None or cap[0] >= locked:
            return locked, frozenset()
        return cap[0], cap[1]

    def set_locked_clocks(self, mhz: int) -> None:
        """Lock the simulated SM clock at ``mhz``; raises when ``mhz`` is not supported."""
        mhz = int(mhz)
        if mhz not in self._clocks:
            raise UnsupportedClockError(
                f"frequency_mhz: {mhz} MHz is not a supported clock of this simulated GPU "
                f"({self._clocks[0]}..{self._clocks[-1]} MHz)"
            )
        with self._state_lock:
            self._locked = mhz
            self.sets += 1
            self._persist()

    def reset_locked_clocks(self) -> None:
        """Remove the simulated SM clock lock (safe concurrently and from a signal handler)."""
        with hold_briefly(self._state_lock):  # safe concurrently and from a signal handler
            self._locked = None
            self.resets += 1
            self._persist()

    def timestamp(self) -> float:
        """Simulated seconds: scaled wall time when ``time_scale > 0``, else the virtual clock."""
        if self.time_scale > 0:
            return self._sim_base + (time.perf_counter() - self._wall_base) / self.time_scale
        return self._virtual

    def energy_mj(self) -> int:
        """The modelled energy counter (mJ), idle time at the blocking power and floors included."""
        energy = self._energy
        if self.time_scale > 0 and self.blocking_power > 0:
            pending = self._pending
            now = self.timestamp() if pending is None else pending[2]
            idle = now - self._busy
            energy += self.blocking_power * max(0.0, idle)
        if self.time_scale > 0:
            energy += self.floor.joules(self.timestamp())
        return int(energy * 1000.0)

    # -- power floors -----------------------------------------------------------------------------

    def floor_unavailable(self) -> str | None:
        """None: the model holds a floor (its energy counts it); not with ``time_scale=0``."""
        return None if self.time_scale > 0 else "time_scale=0 models no idle time to floor"

    def set_power_floor(self, watts: float, ramp_w_per_s: float = 0.0) -> bool:
        """Draw at least ``watts`` from now on: the energy counter adds what the floor lifts.

        While an instruction runs the GPU draws its energy over its time, otherwise the
        blocking power; with a floor, the higher of that and the floor
        (:class:`~perseus_client.gpu.simulated_floor.FloorModel`; the ramp is not modelled).
        """
        if self.time_scale <= 0 or not (math.isfinite(watts) and watts >= 0):
            return False
        self.floor.set(self.timestamp(), watts, ramp_w_per_s)
        return True

    @property
    def power_floor(self) -> float:
        """The floor held now (W; 0: none)."""
        return self.floor.level

    def instruction_cost(
        self, kind: str, stage: int | None = None, mhz: int | None = None
    ) -> tuple[float, float]:
        """Modelled ``(seconds, joules)`` of one instruction at ``mhz`` (default: current clock)."""
        key = (self.stage if stage is None else stage, kind)
        curve = self._curves.get(key)
        if curve is None:
            raise ConfigError(
                "instruction", f"the simulated GPU has no profile data for stage {key[0]} {kind!r}"
            )
        t, e = curve.at(self.current_clock if mhz is None else mhz)
        return t * self._time_factor, e * self._time_factor

    def begin_instruction(self, kind: str, microbatch: int, stage: int | None) -> None:
        """Start an instruction: its modelled time and energy at the clock now, noise applied."""
        t, e = self.instruction_cost(kind, stage)
        if self.noise > 0:
            t *= max(0.0, 1.0 + self.noise * self._rng.gauss(0.0, 1.0))
        if self.energy_noise > 0:
            e *= max(0.0, 1.0 + self.energy_noise * self._rng.gauss(0.0, 1.0))
        self._pending_what = (kind, microbatch, stage)
        self._pending_applied = None if self._cap is None else self._applied_now()
        if self.time_scale > 0:
            start_wall = time.perf_counter()
            start_sim = self._sim_base + (start_wall - self._wall_base) / self.time_scale
            self.floor.switch(start_sim, e / t if t > 0 else self.blocking_power)
            self._pending = (t, e, start_sim, start_wall)
        else:
            self._pending = (t, e, self._virtual, 0.0)
        super().begin_instruction(kind, microbatch, stage)

    def end_instruction(self) -> None:
        """End the instruction: its modelled time passes and its energy is counted."""
        self._end()
        super().end_instruction()

    def _end(self) -> None:
        pending = self._pending
        if pending is None:
            return
        t, e, start_sim, start_wall = pending
        scale = self.time_scale
        if scale > 0:
            now = time.perf_counter()
            remaining = start_wall + t * scale - now
            if remaining > 0:
                # Sleep out the modelled duration; the sleep's overshoot is not counted.
                time.sleep(remaining)
                duration = t
            else:
                # The real work inside the instruction took longer than the model: count it.
                duration = (now - start_wall) / scale
                self._overran(t, now - start_wall)
            self._sim_base = start_sim + duration
            self._wall_base = time.perf_counter()
            self.floor.switch(start_sim + duration, self.blocking_power)
        else:
            duration = t
            self._virtual += t
        self._busy += duration
        self._energy += e
        self._pending = None

    def abort_instruction(self) -> None:
        """The instruction's body raised: count the time it ran, do not sleep out the rest."""
        self._abort()
        super().abort_instruction()

    def _abort(self) -> None:
        pending = self._pending
        if pending is None:
            return
        t, e, start_sim, start_wall = pending
        if self.time_scale > 0:
            now = time.perf_counter()
            duration = min(t, (now - start_wall) / self.time_scale)
            self._sim_base = start_sim + duration
            self._wall_base = now
            self.floor.switch(start_sim + duration, self.blocking_power)
        else:
            duration = 0.0
        self._busy += duration
        self._energy += e * (duration / t if t > 0 else 0.0)
        self._pending = None

    def _overran(self, modelled: float, real_wall: float) -> None:
        self.overruns += 1
        if self.overruns > 1:
            return
        kind, microbatch, stage = self._pending_what
        stage = self.stage if stage is None else stage
        log.warning(
            "SimulatedGpu: %s of microbatch %d on stage %d took %.4f s of real work, longer than "
            "its scaled time %.4f s (%.4f s modelled x time_scale %g): its measured time is %.4f s, "
            "above the model; raise time_scale so that every instruction's scaled time exceeds "
            "its real work (reported once; SimulatedGpu.overruns counts them)",
            kind,
            microbatch,
            stage,
            real_wall,
            modelled * self.time_scale,
            modelled,
            self.time_scale,
            real_wall / self.time_scale,
        )

    # -- state file -----------------------------------------------------------------------------

    def _persist(self) -> None:
        if self._state_path is None:
            return
        doc = {"locked_clock_mhz": self._locked, "sets": self.sets, "resets": self.resets}
        # A temporary file of its own per write: a reset may run while another write (on another
        # thread, or the one a signal handler interrupted) is between its write and its rename.
        tmp = self._state_path.with_name(
            f"{self._state_path.name}.{os.getpid()}.{threading.get_ident()}.{next(self._writes)}.tmp"
        )
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, self._state_path)

    @staticmethod
    def read_state(path: str | Path) -> dict[str, Any]:
        """Read the JSON state a ``state_path`` SimulatedGpu persisted."""
        return dict(json.loads(Path(path).read_text()))
