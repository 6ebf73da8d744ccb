"""The frequency controller: applies SM clock changes off the training thread.

The training thread calls :meth:`FrequencyController.request` before each instruction. A request
for the clock already requested is a no-op (nothing is queued). Otherwise the request is queued
and a background thread applies the queued requests in order. The request's hand-off is a deque
append and one flag test: the controller thread is woken (a lock released, no ``Condition``)
only when it sleeps; a thread that is still applying earlier requests picks the new one up
without a wake. A queued request is skipped (coalesced) when the next one's ``after`` event has
already completed: its instruction has ended, so its lock would only land after it.

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
instruction begins. The client's hot path does both in one call, :meth:`apply_now`: the clock in
effect when a simulated instruction begins is always the clock requested for it, without a
thread hand-off (the controller thread is not woken for a change the caller applies).

**Failures fall back to max clocks.** When the backend refuses a clock (no permission, an
unsupported clock, a driver error), the controller locks the maximum clock instead, and resets the
lock if even that fails, so a GPU never stays at the previous instruction's (lower) clock. Errors
are logged once at ERROR level and kept in :attr:`FrequencyController.last_error`; they never
propagate into training.

**Resets never wait on the controller thread.** That thread holds the apply lock while it waits
on a CUDA event, and an event of a hung GPU or collective never completes. So
:meth:`FrequencyController.reset_now` (signal handlers, ``close``, an exception escaping an
iteration) takes no lock of the controller: it drops the queue, bumps a reset epoch and calls the
backend's reset directly (backends' resets are safe to call concurrently, see
:mod:`perseus_client.gpu.base`). A lock that the controller thread was applying at that moment
may land after the reset; the thread sees the epoch changed when the backend call returns and
resets again, so a reset always has the last word over the requests it dropped.

**The lock as seen from other threads.** :meth:`FrequencyController.lock_state` answers a
:class:`~perseus_client.gpu.applied.LockState` for the applied-clock sampler: a change counter
bumped before and after every backend set/reset (odd while one is in flight; a seqlock, readers
retry or discard), the clock locked, the monotonic time the last change completed and the
instruction (``tag`` of :meth:`~FrequencyController.request`) the lock was requested for. Only the
writers (the controller thread, :meth:`~FrequencyController.flush`,
:meth:`~FrequencyController.reset_now`) touch it; the training thread's request path does not.
A reset from a signal handler that overlaps a change of the controller thread can leave the
counter's parity wrong for that overlap; the sampler's settle time covers the change's end.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Any

from perseus_client.gpu.applied import Instruction, LockState
from perseus_client.gpu.base import GpuBackend

__all__ = ["FrequencyController"]

log = logging.getLogger("perseus_client.controller")

_RESET = -1  # request code for "reset the locked clocks"


def _done(event: Any) -> bool:
    """Whether a CUDA event (``None``: none) has completed; ``False`` when it cannot tell."""
    if event is None:
        return False
    try:
        return bool(event.query())
    except Exception:  # noqa: BLE001 - a fake or broken event: do not skip on its word
        return False


class FrequencyController:
    """Applies clock requests for one GPU in a background thread (see the module docstring)."""

    def __init__(self, gpu: GpuBackend, *, thread_name: str = "perseus-clock") -> None:
        self.gpu = gpu
        self._max = gpu.max_clock
        # seq, mhz, after, epoch, tag
        self._pending: deque[tuple[int, int, Any, int, Instruction | None]] = deque()
        self._apply_lock = threading.RLock()  # orders the controller thread and flush()
        # The controller thread sleeps on this lock (held: asleep); a wake releases it, only
        # while ``_sleeping`` (see :meth:`_wake`): a request to a busy thread costs no wake.
        self._gate = threading.Lock()
        self._gate.acquire()
        self._sleeping = False
        self._requested: int | None = None  # last requested clock (_RESET after a reset)
        self._seq = 0
        self._applied_seq = 0
        self._applied: int | None = None  # clock last applied to the backend (_RESET: reset)
        self._epoch = 0  # bumped by every reset_now(); see the module docstring
        self._generation = 0  # seqlock of the applied lock: odd while a change is in flight
        self._settled_at = time.monotonic()
        self._applied_tag: Instruction | None = None  # instruction the applied lock is for
        self._closed = False
        self._stopping = False
        #: The last error the backend raised while applying a clock (``None``: none so far).
        self.last_error: BaseException | None = None
        self._error_logged = False
        self._fallback_logged = False
        self._thread = threading.Thread(target=self._run, name=thread_name, daemon=True)
        self._thread.start()

    # -- training thread --------------------------------------------------------------------------

    @property
    def requested(self) -> int | None:
        """The last requested clock (``None`` when none was requested or after a reset)."""
        r = self._requested
        return None if r is None or r == _RESET else r

    def set_max_clock(self, mhz: int) -> None:
        """The clock fallbacks lock from now on (the GPU's maximum became known; 0: reset)."""
        self._max = int(mhz)

    @property
    def closed(self) -> bool:
        """True after :meth:`reset_now` (or :meth:`close`).

        Requests are ignored until :meth:`reopen`.
        """
        return self._closed

    def request(
        self, mhz: int, after: Any = None, tag: Instruction | None = None, *, wake: bool = True
    ) -> int:
        """Ask for ``mhz`` to be locked once ``after`` (a CUDA event, optional) has completed.

        ``tag`` is the instruction it is for, published with the lock (:meth:`lock_state`).
        ``wake=False``: leave the controller thread asleep, the caller applies the request
        with :meth:`flush` (what the client does for synchronous backends: waking the thread
        only to find the queue drained cost the training thread a GIL hand-off per
        instruction).

        Returns the request's sequence number (the previous one for a no-op request; its tag is
        dropped: the lock stays attributed to the instruction that requested it).
        """
        if mhz == self._requested or self._closed:
            return self._seq
        self._requested = mhz
        self._seq = seq = self._seq + 1
        self._pending.append((seq, mhz, after, self._epoch, tag))
        if wake and self._sleeping:
            self._wake()
        return seq

    def apply_now(self, mhz: int, after: Any = None) -> None:
        """Synchronous backends: request ``mhz`` and apply it in the calling thread, in one call.

        This is what :meth:`request` with ``wake=False`` and :meth:`flush` do, without the
        queue, once ``after`` (a CUDA event, optional) has completed. A no-op when ``mhz``
        is the clock last requested. Requests still queued are applied first, under the same
        lock: order is kept.
        """
        if mhz == self._requested or self._closed:
            return
        with self._apply_lock:
            if self._pending:
                self._drain(None)
            self._requested = mhz
            self._seq = seq = self._seq + 1
            epoch = self._epoch
            if after is not None:
                try:
                    after.synchronize()
                except Exception as exc:  # noqa: BLE001 - never fail training
                    self._record_error(exc)
            self._apply(mhz, epoch, None)
            if seq > self._applied_seq:
                self._applied_seq = seq

    def request_reset(self) -> int:
        """Ask for the clock lock to be released (queued like a clock change)."""
        if self._requested == _RESET or self._closed:
            return self._seq
        self._requested = _RESET
        self._seq += 1
        self._pending.append((self._seq, _RESET, None, self._epoch, None))
        self._wake()
        return self._seq

    def flush(self, upto: int | None = None) -> None:
        """Apply queued requests up to sequence ``upto`` (all when ``None``) in this thread."""
        if self._closed or self._applied_seq >= (self._seq if upto is None else upto):
            return
        self._drain(upto)

    @property
    def applied_clock(self) -> int | None:
        """The clock the backend last locked (the max clock after a fallback).

        ``None`` when reset or not known. Read by the applied-clock sampler thread.
        """
        a = self._applied
        return None if a is None or a == _RESET else a

    def lock_state(self) -> LockState:
        """The applied lock as one snapshot (see the module docstring); any thread, lock-free."""
        generation = self._generation
        a = self._applied
        return LockState(
            generation,
            None if a is None or a == _RESET else a,
            self._settled_at,
            self._applied_tag,
        )

    @property
    def applied_seq(self) -> int:
        """Sequence number of the last request applied (or skipped after an error)."""
        return self._applied_seq

    # -- controller thread ------------------------------------------------------------------------

    def _wake(self) -> None:
        """Wake the controller thread if it sleeps (any thread; a second wake is harmless)."""
        self._sleeping = False
        try:  # noqa: SIM105 - a plain try: contextlib.suppress costs a context manager per wake
            self._gate.release()
        except RuntimeError:  # already released: the thread is awake or about to be
            pass

    def _run(self) -> None:
        # Lost wakes cannot happen: ``_sleeping`` is set before the queue is checked, and a
        # request appends before it reads ``_sleeping``; a stale release only costs one empty
        # round. The thread runs a few bytecodes per wake: the GIL it takes from training.
        gate = self._gate
        pending = self._pending
        drain = self._drain
        while True:
            self._sleeping = True
            if not pending and not self._stopping:
                gate.acquire()
            self._sleeping = False
            if self._stopping:
                return
            if pending:
                drain(None)

    def _drain(self, upto: int | None) -> None:
        with self._apply_lock:
            pending = self._pending
            while True:
                try:
                    item = pending.popleft()
                except IndexError:
                    break
                seq, mhz, after, epoch, tag = item
                if upto is not None and seq > upto:
                    pending.appendleft(item)  # only this lock's holder pops: order is kept
                    break
                if epoch != self._epoch:
                    continue  # queued before a reset_now(): dropped
                if upto is None and pending and _done(pending[0][2]):
                    # Superseded: the next request waits on this instruction's end event,
                    # which has completed, so this lock would land after its instruction.
                    self._applied_seq = max(self._applied_seq, seq)
                    continue
                if after is not None:
                    try:
                        after.synchronize()
                    except Exception as exc:  # noqa: BLE001 - never fail training
                        self._record_error(exc)
                self._apply(mhz, epoch, tag)
                self._applied_seq = max(self._applied_seq, seq)

    def _begin_change(self) -> None:
        self._generation += 1  # odd: a change is in flight

    def _end_change(self, tag: Instruction | None) -> None:
        self._applied_tag = tag
        self._settled_at = time.monotonic()
        self._generation += 1

    def _apply(self, mhz: int, epoch: int, tag: Instruction | None = None) -> None:
        if self._closed or epoch != self._epoch:
            return
        if mhz == self._applied:
            if tag is not None and mhz != _RESET:
                self._applied_tag = tag  # same lock, now for this instruction
            return
        gpu = self.gpu
        self._begin_change()
        try:
            if mhz == _RESET:
                gpu.reset_locked_clocks()
            else:
                gpu.set_locked_clocks(mhz)
            self._applied = mhz
        except Exception as exc:  # noqa: BLE001 - never fail training
            self._applied = None
            self._record_error(exc)
            if mhz != _RESET:
                self._fall_back(mhz)
        finally:
            self._end_change(tag if mhz != _RESET else None)
        if mhz != _RESET and self._epoch != epoch:
            # A reset ran while this lock (or its fallback) was in flight and may have landed
            # before it at the backend: reset again so that the reset has the last word.
            self._reset_backend()

    def _fall_back(self, failed: int) -> None:
        """After ``failed`` was refused: lock the maximum clock, else reset the lock."""
        gpu = self.gpu
        if failed != self._max and self._max > 0:
            try:
                gpu.set_locked_clocks(self._max)
                self._applied = self._max
                return
            except Exception as exc:  # noqa: BLE001
                self._log_fallback(exc)
        try:
            gpu.reset_locked_clocks()
            self._applied = _RESET
        except Exception as exc:  # noqa: BLE001
            self._log_fallback(exc)

    def _record_error(self, exc: BaseException) -> None:
        self.last_error = exc
        if not self._error_logged:
            self._error_logged = True
            log.error(
                "perseus: could not apply a GPU clock change (training continues at max clocks): "
                "%s",
                exc,
            )

    def _log_fallback(self, exc: BaseException) -> None:
        if not self._fallback_logged:
            self._fallback_logged = True
            log.error("perseus: could not fall back to max clocks either: %s", exc)

    # -- resets and shutdown ----------------------------------------------------------------------

    def _reset_backend(self) -> None:
        self._begin_change()
        try:
            self.gpu.reset_locked_clocks()
            self._applied = _RESET
        except Exception as exc:  # noqa: BLE001
            self._applied = None
            self._record_error(exc)
        finally:
            self._end_change(None)

    def reset_now(self, *, close: bool = True) -> None:
        """Drop queued requests and reset the locked clocks now, in the calling thread.

        Takes no lock the controller thread can hold (see the module docstring), so it returns
        even while that thread waits forever on a CUDA event; safe from a signal handler. With
        ``close`` (default) later requests are ignored until :meth:`reopen`; without it they are
        applied again (an exception escaping an iteration that training may survive).
        """
        self._epoch += 1
        if close:
            self._closed = True
        self._pending.clear()
        self._requested = _RESET
        self._applied_seq = self._seq
        self._reset_backend()

    def reopen(self) -> None:
        """Accept requests again after :meth:`reset_now` (the next request is applied)."""
        if not self._stopping:
            self._requested = _RESET
            self._closed = False

    def close(self, *, reset: bool = True) -> None:
        """Stop the thread; with ``reset`` (default) release the clock lock first.

        Never waits more than a few seconds for a controller thread stuck on a CUDA event.
        """
        if reset and not self._closed:
            self.reset_now()
        self._closed = True
        self._stopping = True
        self._wake()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)
