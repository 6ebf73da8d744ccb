"""A wrapper that records every clock request and the clock each instruction ran at.

``RecordingGpu(inner)`` forwards everything to ``inner`` (a :class:`SimulatedGpu`, or an
:class:`NvmlGpu` in ``dry_run``) and keeps two logs:

- :attr:`RecordingGpu.requests`: every lock/reset, as :class:`ClockRequest` (``op`` is ``"set"`` or
  ``"reset"``, ``mhz`` the clock or ``None``);
- :attr:`RecordingGpu.instructions`: every instruction, as :class:`InstructionRecord` with the
  clock requested for it (the locked clock in effect when it began).

Clock changes are synchronous for this backend (``synchronous_clocks = True``), so the clock in an
:class:`InstructionRecord` is exactly the clock the client asked for before that instruction.
With ``log_path`` set, each record is also appended to a JSON-lines file as it happens (one object
per line, ``{"event": "set"|"reset"|"instruction", ...}``), so a test can read what a separate
training process did even if it was killed; :func:`read_log` parses that file.
"""

from __future__ import annotations

import json
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

from perseus_client.gpu.applied import AppliedClockReport
from perseus_client.gpu.base import DeviceIdentity, GpuBackend, hold_briefly

__all__ = ["RecordingGpu", "ClockRequest", "InstructionRecord", "read_log"]


@dataclass(frozen=True)
class ClockRequest:
    """One lock (``op="set"``, ``mhz`` set) or reset (``op="reset"``, ``mhz=None``)."""

    op: str
    mhz: int | None


@dataclass(frozen=True)
class InstructionRecord:
    """An executed instruction and the SM clock it ran at (``None``: unlocked, i.e. max)."""

    kind: str
    microbatch: int
    stage: int | None
    mhz: int | None


class RecordingGpu(GpuBackend):
    """Record every clock request and instruction, forwarding to ``inner``."""

    synchronous_clocks = True

    def __init__(self, inner: GpuBackend, *, log_path: str | Path | None = None) -> None:
        self.inner = inner
        self.name = inner.name
        self.samples_itself = inner.samples_itself
        self.requests: list[ClockRequest] = []
        self.instructions: list[InstructionRecord] = []
        self._locked: int | None = None
        self._lock = threading.RLock()
        self._log: IO[str] | None = open(log_path, "a", buffering=1) if log_path else None  # noqa: SIM115

    def _write(self, doc: dict[str, Any]) -> None:
        if self._log is not None:
            self._log.write(json.dumps(doc) + "\n")

    def identity(self) -> DeviceIdentity:
        """The inner backend's device identity."""
        return self.inner.identity()

    def supported_clocks(self) -> tuple[int, ...]:
        """The inner backend's supported SM clocks (MHz)."""
        return self.inner.supported_clocks()

    def max_power_limit_w(self) -> float | None:
        """The inner backend's maximum power limit (W)."""
        return self.inner.max_power_limit_w()

    @property
    def locked_clock(self) -> int | None:
        """The last locked clock requested (``None`` after a reset or before any lock)."""
        return self._locked

    def set_locked_clocks(self, mhz: int) -> None:
        """Lock the inner backend's SM clock at ``mhz``, and remember it for the records."""
        with self._lock:
            self.inner.set_locked_clocks(mhz)
            self._locked = int(mhz)
            self.requests.append(ClockRequest("set", int(mhz)))
            self._write({"event": "set", "mhz": int(mhz)})

    def reset_locked_clocks(self) -> None:
        """Remove the inner backend's SM clock lock (safe concurrently and from signal handlers)."""
        with hold_briefly(self._lock):  # safe concurrently and from a signal handler (see base)
            self.inner.reset_locked_clocks()
            self._locked = None
            self.requests.append(ClockRequest("reset", None))
            self._write({"event": "reset", "mhz": None})

    def floor_unavailable(self) -> str | None:
        """The wrapped backend's answer."""
        return self.inner.floor_unavailable()

    def set_power_floor(self, watts: float, ramp_w_per_s: float = 0.0) -> bool:
        """The wrapped backend's floor."""
        return self.inner.set_power_floor(watts, ramp_w_per_s)

    def energy_mj(self) -> int:
        """The inner backend's energy counter (mJ)."""
        return self.inner.energy_mj()

    def read_clock(self) -> tuple[int, frozenset[str]] | None:
        """The inner backend's SM clock and clock-event reasons."""
        return self.inner.read_clock()

    def power_w(self) -> float | None:
        """The inner backend's power draw (W)."""
        return self.inner.power_w()

    def timestamp(self) -> float:
        """The inner backend's time (s)."""
        return self.inner.timestamp()

    def begin_instruction(self, kind: str, microbatch: int, stage: int | None) -> None:
        """Record the instruction with the clock locked now, then start it on the inner backend."""
        rec = InstructionRecord(kind, microbatch, stage, self._locked)
        self.instructions.append(rec)
        if self._log is not None:
            self._write({"event": "instruction", **asdict(rec)})
        self.inner.begin_instruction(kind, microbatch, stage)

    def end_instruction(self) -> None:
        """End the instruction on the inner backend."""
        self.inner.end_instruction()

    def abort_instruction(self) -> None:
        """Abort the instruction on the inner backend."""
        self.inner.abort_instruction()

    def synchronize(self) -> None:
        """Wait for the inner backend's queued work."""
        self.inner.synchronize()

    def sample_applied_clock(self) -> tuple[int, frozenset[str]] | None:
        """The inner backend's applied-clock sample."""
        return self.inner.sample_applied_clock()

    def running_instruction(self) -> tuple[str, int, int | None] | None:
        """The inner backend's running instruction."""
        return self.inner.running_instruction()

    def take_applied_clocks(self) -> AppliedClockReport | None:
        """The inner backend's applied clocks since the last call."""
        return self.inner.take_applied_clocks()

    def close(self) -> None:
        """Close the request log, if one is open."""
        if self._log is not None:
            self._log.close()
            self._log = None
        self.inner.close()


def read_log(path: str | Path) -> tuple[list[ClockRequest], list[InstructionRecord]]:
    """Parse a :class:`RecordingGpu` JSON-lines log into (requests, instructions)."""
    requests: list[ClockRequest] = []
    instructions: list[InstructionRecord] = []
    for line in Path(path).read_text().splitlines():
        if not line.strip():
            continue
        doc = json.loads(line)
        if doc["event"] == "instruction":
            instructions.append(
                InstructionRecord(doc["kind"], doc["microbatch"], doc["stage"], doc["mhz"])
            )
        else:
            requests.append(ClockRequest(doc["event"], doc["mhz"]))
    return requests, instructions
