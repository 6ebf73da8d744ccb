"""Fail-open clock control: a GPU backend that is there even when clock control is not.

:class:`FailOpenGpu` wraps the backend a :class:`~perseus_client.PerseusClient` builds by
default (``DaemonGpu`` through ``perseus gpud``, else ``NvmlGpu``). When building that backend
raises a :class:`~perseus_client.errors.ClockControlUnavailableError` (the daemon's socket
missing, refused or not permitted, the GPU leased by another process, no NVML or driver, no
permission to lock clocks), training goes on:

- one warning is logged, naming the reason;
- the GPU runs at its current clocks: clock requests are remembered, never applied; energy reads
  return the last value (0 before control was ever had), so reports carry no energy;
- a daemon thread retries with bounded exponential backoff (``retry_initial`` doubling up to
  ``retry_max`` seconds); when the backend can be built, it takes over: the clock last requested
  is applied, the energy counter continues from where it stood, and one line is logged;
- :attr:`FailOpenGpu.state` (``"active"`` or ``"unavailable"``) and :attr:`FailOpenGpu.reason`
  say where things stand; the client reports them to the server (rank status
  ``clock_control``, metric ``perseus_ranks_without_clock_control``).

A backend that was built but is refused later (``NvmlGpu`` without the permission to lock
clocks: the refusal comes with the first lock) is handled the same way: the refusal is not
raised, the state turns ``unavailable`` with the reason, and the thread retries the clock last
requested. A ``DaemonGpu`` that loses its daemon mid-run handles the outage itself (it
re-leases when the daemon is back); meanwhile the state reads ``unavailable``.

Errors a user must fix are not clock-control errors and still raise where they arise: an
unsupported clock (:class:`~perseus_client.errors.UnsupportedClockError`, the controller falls
back to the maximum clock), a malformed option or environment variable
(:class:`~perseus_client.errors.ConfigError`).

A clock of 0 or less is a reset: while control is unavailable the GPU's maximum clock is not
known, and the client asks for "the maximum clock" as 0 until it is.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from perseus_client.errors import ClockControlUnavailableError
from perseus_client.gpu.base import DeviceIdentity, GpuBackend, hold_briefly

if TYPE_CHECKING:
    from perseus_client.gpu.applied import AppliedClockReport, Instruction

__all__ = ["ACTIVE", "UNAVAILABLE", "FailOpenGpu", "MAX_REASON"]

log = logging.getLogger("perseus_client.clock_control")

ACTIVE = "active"
UNAVAILABLE = "unavailable"
#: Characters of a reason kept (the server refuses longer ones).
MAX_REASON = 240


def _reason(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 3] + "..."


class FailOpenGpu(GpuBackend):
    """The backend ``factory()`` builds, or none while it cannot (see the module docstring).

    Args:
        factory: builds the real backend; raises ``ClockControlUnavailableError`` while clock
            control cannot be had (any other exception propagates from the constructor).
        retry_initial, retry_max: bounds of the retry backoff, seconds (> 0).
    """

    def __init__(
        self,
        factory: Callable[[], GpuBackend],
        *,
        retry_initial: float = 1.0,
        retry_max: float = 30.0,
    ) -> None:
        if not retry_initial > 0:
            raise ValueError(f"retry_initial: must be > 0 seconds, got {retry_initial}")
        if not retry_max >= retry_initial:
            raise ValueError(f"retry_max: must be >= retry_initial, got {retry_max}")
        self._factory = factory
        self.retry_initial = float(retry_initial)
        self.retry_max = float(retry_max)
        self._lock = threading.RLock()
        self._inner: GpuBackend | None = None
        self._refused = False  # built, but its last clock change was refused
        self._desired: int | None = None  # the clock last requested (None: reset)
        self._energy_offset = 0
        self._last_energy = 0
        self._reason: str | None = None
        self._listeners: list[Callable[[], None]] = []
        self._warned = False
        self._closing = threading.Event()
        self._wake = threading.Event()
        #: How many times control was taken after being unavailable.
        self.recoveries = 0
        try:
            self._inner = factory()
        except ClockControlUnavailableError as exc:
            self._unavailable(exc)
        self._thread = threading.Thread(target=self._run, name="perseus-clock-control", daemon=True)
        self._thread.start()

    # -- state ------------------------------------------------------------------------------------

    @property
    def backend(self) -> GpuBackend | None:
        """The real backend (``None`` while it could not be built)."""
        return self._inner

    @property
    def state(self) -> str:
        """``"active"`` while clocks are controlled, else ``"unavailable"``."""
        return ACTIVE if self.reason is None else UNAVAILABLE

    @property
    def reason(self) -> str | None:
        """Why clock control is unavailable (``None``: it is active)."""
        inner = self._inner
        if inner is None or self._refused:
            return self._reason or "clock control unavailable"
        if getattr(inner, "connected", True) is False:
            return "lost the node daemon; leasing the GPU again when it is back"
        return None

    def add_listener(self, fn: Callable[[], None]) -> None:
        """Call ``fn()`` (from a background thread) whenever :attr:`state` may have changed."""
        self._listeners.append(fn)

    def _notify(self) -> None:
        for fn in list(self._listeners):
            try:
                fn()
            except Exception:  # noqa: BLE001 - a listener never stops clock control
                log.exception("perseus: clock-control listener failed")

    def _unavailable(self, exc: BaseException) -> None:
        self._reason = _reason(exc)
        if not self._warned:
            self._warned = True
            log.warning(
                "perseus: clock control is unavailable (%s); training runs at the GPU's current "
                "clocks and Perseus keeps trying in the background",
                self._reason,
            )
        else:
            log.debug("perseus: clock control still unavailable: %s", self._reason)

    # -- retries ----------------------------------------------------------------------------------

    def _run(self) -> None:
        delay = self.retry_initial
        while True:
            if self._inner is not None and not self._refused:
                self._wake.wait()  # nothing to retry until a refusal
                self._wake.clear()
                delay = self.retry_initial
            if self._closing.is_set():
                return
            if self._closing.wait(delay):
                return
            if self._try_once():
                log.warning("perseus: clock control is active again (%s)", self.name)
                self.recoveries += 1
                self._notify()
                delay = self.retry_initial
            else:
                delay = min(2.0 * delay, self.retry_max)

    def _try_once(self) -> bool:
        inner = self._inner
        if inner is None:
            try:
                inner = self._factory()
            except ClockControlUnavailableError as exc:
                self._unavailable(exc)
                return False
            except Exception as exc:  # noqa: BLE001 - retrying never fails training
                self._unavailable(exc)
                return False
            with self._lock:
                if self._closing.is_set():
                    inner.close()
                    return False
                try:
                    self._energy_offset = self._last_energy - inner.energy_mj()
                    self._apply_desired(inner)
                except ClockControlUnavailableError as exc:
                    self._unavailable(exc)
                    self._refused = True
                except Exception as exc:  # noqa: BLE001
                    log.debug("perseus: could not restore the clock: %s", exc)
                self._inner = inner
            return not self._refused
        with self._lock:
            try:
                self._apply_desired(inner)
            except ClockControlUnavailableError as exc:
                self._unavailable(exc)
                return False
            except Exception as exc:  # noqa: BLE001
                log.debug("perseus: could not restore the clock: %s", exc)
            self._refused = False
        return True

    def _apply_desired(self, inner: GpuBackend) -> None:
        mhz = self._desired
        if mhz is not None and mhz > 0 and mhz in inner.supported_clocks():
            inner.set_locked_clocks(mhz)
        else:
            inner.reset_locked_clocks()

    def __getattr__(self, attr: str) -> Any:
        """Other attributes are the real backend's (``dry_run``, ``requests``, ``index``...)."""
        inner = self.__dict__.get("_inner")
        if inner is None:
            raise AttributeError(
                f"{attr!r}: clock control is unavailable, there is no backend to ask"
            )
        return getattr(inner, attr)

    # -- GpuBackend -------------------------------------------------------------------------------

    @property
    def name(self) -> str:  # type: ignore[override]
        """The real backend's name; empty while there is none."""
        inner = self._inner
        return inner.name if inner is not None else ""

    @property
    def synchronous_clocks(self) -> bool:  # type: ignore[override]
        """Whether the real backend applies clocks synchronously; False while there is none."""
        inner = self._inner
        return bool(inner.synchronous_clocks) if inner is not None else False

    @property
    def samples_itself(self) -> bool:  # type: ignore[override]
        """Whether the real backend samples its applied clocks itself; False while there is none."""
        inner = self._inner
        return bool(inner.samples_itself) if inner is not None else False

    def identity(self) -> DeviceIdentity:
        """The real backend's device identity; index 0, the rest unknown, while there is none."""
        inner = self._inner
        return inner.identity() if inner is not None else DeviceIdentity(0)

    def supported_clocks(self) -> tuple[int, ...]:
        """The real backend's supported SM clocks (MHz); none while there is no backend."""
        inner = self._inner
        return inner.supported_clocks() if inner is not None else ()

    @property
    def max_clock(self) -> int:
        """The GPU's highest clock (0 while it is not known)."""
        clocks = self.supported_clocks()
        return clocks[0] if clocks else 0

    def set_locked_clocks(self, mhz: int) -> None:
        """Lock the SM clock at ``mhz`` (0 or less resets), or remember it until control is had.

        When the backend refuses, clock control becomes unavailable and the retry thread is
        woken.
        """
        mhz = int(mhz)
        if mhz <= 0:
            self.reset_locked_clocks()
            return
        with self._lock:
            self._desired = mhz
            inner = self._inner
            if inner is None or self._refused:
                return  # applied when control is had
            try:
                inner.set_locked_clocks(mhz)
            except ClockControlUnavailableError as exc:
                self._refused = True
                self._unavailable(exc)
                self._wake.set()
                changed = True
            else:
                changed = False
        if changed:
            self._notify()

    def reset_locked_clocks(self) -> None:
        """Remove the SM clock lock, now if control is had; no clock is wanted from now on."""
        with hold_briefly(self._lock):
            self._desired = None
            inner = self._inner
            if inner is None or self._refused:
                return
            try:
                inner.reset_locked_clocks()
            except ClockControlUnavailableError as exc:
                self._unavailable(exc)

    def floor_unavailable(self) -> str | None:
        """The real backend's answer; while there is none, why clock control is unavailable."""
        inner = self._inner
        if inner is None:
            return f"clock control is unavailable ({self._reason or 'no backend'})"
        return inner.floor_unavailable()

    def set_power_floor(self, watts: float, ramp_w_per_s: float = 0.0) -> bool:
        """The real backend's floor (False while there is none)."""
        inner = self._inner
        return inner.set_power_floor(watts, ramp_w_per_s) if inner is not None else False

    def energy_mj(self) -> int:
        """The energy counter (mJ), continuous across backends; the last value while none."""
        inner = self._inner
        if inner is not None:
            self._last_energy = inner.energy_mj() + self._energy_offset
        return self._last_energy

    def timestamp(self) -> float:
        """The real backend's time (s); wall time while there is none."""
        inner = self._inner
        return inner.timestamp() if inner is not None else time.perf_counter()

    def read_clock(self) -> tuple[int, frozenset[str]] | None:
        """The real backend's SM clock and clock-event reasons; ``None`` while there is none."""
        inner = self._inner
        return inner.read_clock() if inner is not None else None

    def power_w(self) -> float | None:
        """The real backend's power draw (W); ``None`` while there is none."""
        inner = self._inner
        return inner.power_w() if inner is not None else None

    def begin_instruction(self, kind: str, microbatch: int, stage: int | None) -> None:
        """Tell the real backend, if any, that an instruction starts."""
        inner = self._inner
        if inner is not None:
            inner.begin_instruction(kind, microbatch, stage)

    def end_instruction(self) -> None:
        """Tell the real backend, if any, that the instruction's body returned."""
        inner = self._inner
        if inner is not None:
            inner.end_instruction()

    def abort_instruction(self) -> None:
        """Tell the real backend, if any, that the instruction's body raised."""
        inner = self._inner
        if inner is not None:
            inner.abort_instruction()

    def sample_applied_clock(self) -> tuple[int, frozenset[str]] | None:
        """The real backend's applied-clock sample; ``None`` while there is none."""
        inner = self._inner
        return inner.sample_applied_clock() if inner is not None else None

    def running_instruction(self) -> Instruction | None:
        """The real backend's running instruction; ``None`` while there is none."""
        inner = self._inner
        return inner.running_instruction() if inner is not None else None

    def take_applied_clocks(self) -> AppliedClockReport | None:
        """The real backend's applied clocks since the last call; ``None`` while there is none."""
        inner = self._inner
        return inner.take_applied_clocks() if inner is not None else None

    def synchronize(self) -> None:
        """Wait for the real backend's queued work, if there is a backend."""
        inner = self._inner
        if inner is not None:
            inner.synchronize()

    def close(self) -> None:
        """Stop retrying and close the real backend (does not reset clocks; the client does)."""
        self._closing.set()
        self._wake.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=2.0)
        inner = self._inner  # kept: its attributes stay readable (``requests``...)
        if inner is not None:
            inner.close()
