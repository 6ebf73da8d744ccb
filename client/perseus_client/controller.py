"""The frequency controller: applies SM clock changes off the training thread.

The training thread calls :meth:`FrequencyController.request` before each instruction. A request
for the clock already requested is a no-op (nothing is queued). Otherwise the request is queued
and a background thread applies the queued requests strictly in order.

**When a change takes effect (GPUs).** CUDA launches are asynchronous: when the CPU enters
instruction *i*, the GPU may still be running instruction *i-1*. Locking the clock right away
would slow down or speed up the tail of *i-1*. So the client records a CUDA event at the end of
each instruction (``after=`` of the next request) and the controller thread waits on that event
(``event.synchronize()``, which blocks only the controller thread) before calling NVML. The
training thread never synchronises with the GPU and never waits for NVML (a lock takes
~ms). The residual error is the controller's wake-up latency after the event completes
(tens of µs), against instructions of tens of ms.

**Simulated and recording backends** (``backend.synchronous_clocks``) have no device queue: the
controller thread applies requests in order, and :meth:`flush` lets the training thread apply
whatever is still queued itself (under the same lock, so order is kept) right before the
instruction begins. So the clock in effect when a simulated instruction begins is always the
clock requested for it, without a thread hand-off on the hot path.

Errors from the backend (no permission, unsupported clock) are logged once at ERROR level and
kept in :attr:`FrequencyController.last_error`; they never propagate into training.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import Any

from perseus_client.gpu.base import GpuBackend

__all__ = ["FrequencyController"]

log = logging.getLogger("perseus_client.controller")

_RESET = -1  # request code for "reset the locked clocks"


class FrequencyController:
    """Applies clock requests for one GPU in a background thread (see the module docstring)."""

    def __init__(self, gpu: GpuBackend, *, thread_name: str = "perseus-clock") -> None:
        self.gpu = gpu
        self._pending: deque[tuple[int, int, Any]] = deque()
        self._apply_lock = threading.RLock()
        self._wake = threading.Event()
        self._requested: int | None = None  # last requested clock (_RESET after a reset)
        self._seq = 0
        self._applied_seq = 0
        self._applied: int | None = None  # clock last applied to the backend (_RESET: reset)
        self._closed = False
        self._stopping = False
        #: The last error the backend raised while applying a clock (``None``: none so far).
        self.last_error: BaseException | None = None
        self._error_logged = False
        self._thread = threading.Thread(target=self._run, name=thread_name, daemon=True)
        self._thread.start()

    # -- training thread --------------------------------------------------------------------------

    @property
    def requested(self) -> int | None:
        """The last requested clock (``None`` when none was requested or after a reset)."""
        r = self._requested
        return None if r is None or r == _RESET else r

    def request(self, mhz: int, after: Any = None) -> int:
        """Ask for ``mhz`` to be locked once ``after`` (a CUDA event, optional) has completed.

        Returns the request's sequence number (the previous one for a no-op request).
        """
        if mhz == self._requested or self._closed:
            return self._seq
        self._requested = mhz
        self._seq += 1
        self._pending.append((self._seq, mhz, after))
        self._wake.set()
        return self._seq

    def request_reset(self) -> int:
        """Ask for the clock lock to be released (queued like a clock change)."""
        if self._requested == _RESET or self._closed:
            return self._seq
        self._requested = _RESET
        self._seq += 1
        self._pending.append((self._seq, _RESET, None))
        self._wake.set()
        return self._seq

    def flush(self, upto: int | None = None) -> None:
        """Apply queued requests up to sequence ``upto`` (all when ``None``) in this thread."""
        if self._applied_seq >= (self._seq if upto is None else upto):
            return
        self._drain(upto)

    @property
    def applied_seq(self) -> int:
        """Sequence number of the last request applied (or skipped after an error)."""
        return self._applied_seq

    # -- controller thread ------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._stopping:
                return
            self._drain(None)

    def _drain(self, upto: int | None) -> None:
        with self._apply_lock:
            pending = self._pending
            while pending:
                seq, mhz, after = pending[0]
                if upto is not None and seq > upto:
                    break
                pending.popleft()
                if after is not None:
                    try:
                        after.synchronize()
                    except Exception as exc:  # noqa: BLE001 - never fail training
                        self._record_error(exc)
                if mhz != self._applied and not self._closed:
                    try:
                        if mhz == _RESET:
                            self.gpu.reset_locked_clocks()
                        else:
                            self.gpu.set_locked_clocks(mhz)
                        self._applied = mhz
                    except Exception as exc:  # noqa: BLE001 - never fail training
                        self._applied = None
                        self._record_error(exc)
                self._applied_seq = seq

    def _record_error(self, exc: BaseException) -> None:
        self.last_error = exc
        if not self._error_logged:
            self._error_logged = True
            log.error("perseus: could not apply a GPU clock change (training continues): %s", exc)

    # -- shutdown ---------------------------------------------------------------------------------

    def reset_now(self) -> None:
        """Drop queued requests and reset the locked clocks immediately, in the calling thread.

        Safe to call from a signal handler on a thread that is inside :meth:`flush`.
        """
        with self._apply_lock:
            self._pending.clear()
            self._closed = True
            self._applied_seq = self._seq
            try:
                self.gpu.reset_locked_clocks()
                self._applied = _RESET
            except Exception as exc:  # noqa: BLE001
                self._record_error(exc)

    def close(self, *, reset: bool = True) -> None:
        """Stop the thread; with ``reset`` (default) release the clock lock first."""
        if reset and not self._closed:
            self.reset_now()
        self._closed = True
        self._stopping = True
        self._wake.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)
