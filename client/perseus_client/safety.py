"""Clock reset on every catchable death: signal handlers and an ``atexit`` hook.

:class:`ResetGuard` installs, for one client, a handler for each signal that ends a process by
default and that Python can run a handler for:

- SIGTERM, SIGINT, SIGHUP and SIGQUIT (supervisors, terminals, ``kill``);
- SIGABRT sent by another process (a watchdog such as systemd's ``WatchdogSignal``): skipped when
  :mod:`faulthandler` is enabled, whose C handler for a native ``abort()`` it would replace;
- SIGUSR1 and SIGUSR2 (batch schedulers send them before a time limit).

The handler first resets the GPU clocks, then does what the previous handler would have done:
call it if it was a Python function (its exceptions, such as ``SystemExit``, propagate), raise
``KeyboardInterrupt`` for a default SIGINT, or restore the default disposition and re-send the
signal, so the process still dies of that signal with the status supervisors expect. A signal the
process ignores (``SIG_IGN``, e.g. SIGHUP under ``nohup``) cannot end it and gets no handler.
SIGUSR1/SIGUSR2 are often handled by the application and survived (checkpoint, dump stacks): when
the previous Python handler returns, the guard calls ``resume`` and clock control goes on from the
next instruction. An ``atexit`` hook resets at a normal interpreter exit without ``close()``.

**The reset never waits on the clock thread.** It runs in a helper thread and the handler waits
for it at most :attr:`ResetGuard.deadline_s` seconds, then chains anyway: a reset stuck in the
driver cannot keep SIGTERM from ending the process. (The client's reset itself takes no lock the
clock thread can hold; see :mod:`perseus_client.controller`.) A second signal that arrives while
a reset is running chains at once.

**What Python cannot do.** Python runs signal handlers on the main thread between bytecodes: a
main thread stuck inside a long C call (a collective that never returns) runs the handler only
when that call returns. SIGKILL (and so the OOM killer and a container stop after its grace
period) and ``os._exit`` run no handler at all. A real SIGSEGV, SIGBUS, SIGFPE, SIGILL or an
``abort()`` in native code cannot run Python code either (the handler would only run after the
faulting instruction, which never completes; ``abort()`` kills the process when the handler
returns), so the guard installs no handler for them. For all of those run the node daemon
``perseus gpud`` and let the client use :class:`~perseus_client.gpu.daemon.DaemonGpu` (the
default when the daemon's socket exists): the daemon resets a GPU as soon as its holder's
connection closes, whatever killed the holder, or when the holder stops heartbeating (see
``docs/gpud.md``). Without the daemon, put ``nvidia-smi -rgc`` in the job's epilogue.
"""

from __future__ import annotations

import atexit
import faulthandler
import logging
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

__all__ = ["ResetGuard", "guarded_signals"]

log = logging.getLogger("perseus_client.safety")

#: Signals after which the process is expected to end: the clocks stay reset.
_ENDING = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGABRT")
#: Signals an application may handle and survive: clock control resumes after its handler.
_SURVIVABLE = ("SIGUSR1", "SIGUSR2")
_SURVIVABLE_NUMBERS = frozenset(int(getattr(signal, n)) for n in _SURVIVABLE if hasattr(signal, n))


def guarded_signals() -> tuple[signal.Signals, ...]:
    """The signals a :class:`ResetGuard` handles on this platform, now.

    SIGABRT is left out while :mod:`faulthandler` is enabled (see the module docstring).
    """
    names = [n for n in _ENDING + _SURVIVABLE if hasattr(signal, n)]
    if faulthandler.is_enabled():
        names.remove("SIGABRT")
    return tuple(getattr(signal, n) for n in names)


class ResetGuard:
    """Calls ``reset`` on the guarded signals and at interpreter exit, then chains.

    Args:
        reset: resets the clocks (must not wait on the clock thread; called from a helper thread).
        resume: called when an application's SIGUSR1/SIGUSR2 handler returned (clock control goes
            on); ``None``: clocks stay reset.
        signals: install the signal handlers (main thread only; else a warning).
    """

    #: Seconds a signal handler waits for the reset before it chains anyway.
    deadline_s: float = 3.0

    def __init__(
        self,
        reset: Callable[[], None],
        *,
        resume: Callable[[], None] | None = None,
        signals: bool = True,
    ) -> None:
        self._reset = reset
        self._resume = resume
        self._previous: dict[int, Any] = {}
        self._active = True
        self._resetting = False
        if signals:
            if threading.current_thread() is threading.main_thread():
                for sig in guarded_signals():
                    self._install(sig)
            else:
                log.warning(
                    "perseus: client created outside the main thread; signals will not reset "
                    "GPU clocks (create it on the main thread, or reset clocks in your handler)"
                )
        atexit.register(self._at_exit)

    def _install(self, sig: signal.Signals) -> None:
        try:
            if signal.getsignal(sig) == signal.SIG_IGN:
                return  # an ignored signal cannot end the process
            self._previous[sig] = signal.signal(sig, self._handle)
        except (ValueError, OSError) as exc:  # pragma: no cover - exotic platforms
            log.debug("perseus: cannot handle signal %s: %s", sig, exc)

    @property
    def installed(self) -> tuple[int, ...]:
        """The signals this guard installed a handler for."""
        return tuple(self._previous)

    def _at_exit(self) -> None:
        if self._active:
            self._reset_within_deadline("interpreter exit")

    def _reset_within_deadline(self, why: str) -> None:
        """Run ``reset`` in a helper thread; wait for it at most :attr:`deadline_s` seconds."""
        done = threading.Event()

        def run() -> None:
            try:
                self._reset()
            except Exception:  # noqa: BLE001 - must still chain
                log.exception("perseus: clock reset on %s failed", why)
            finally:
                done.set()

        self._resetting = True
        try:
            try:
                threading.Thread(target=run, name="perseus-reset", daemon=True).start()
            except RuntimeError:  # no new threads at interpreter shutdown
                run()
            if not done.wait(self.deadline_s):
                log.error(
                    "perseus: the clock reset on %s did not finish within %.1f s; going on "
                    "(the node daemon or the job's epilogue must reset the GPU)",
                    why,
                    self.deadline_s,
                )
        finally:
            self._resetting = False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._active and not self._resetting:
            self._reset_within_deadline(f"signal {signal.Signals(signum).name}")
        prev = self._previous.get(signum, signal.SIG_DFL)
        if callable(prev):
            prev(signum, frame)
            if self._active and self._resume is not None and signum in _SURVIVABLE_NUMBERS:
                self._resume()  # the application handled the signal and goes on
            return
        if prev == signal.SIG_IGN:
            return
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    def uninstall(self) -> None:
        """Stop resetting; restore the previous handlers where ours is still the installed one."""
        self._active = False
        atexit.unregister(self._at_exit)
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, prev in self._previous.items():
            try:
                if signal.getsignal(sig) == self._handle:
                    signal.signal(sig, prev if prev is not None else signal.SIG_DFL)
            except (ValueError, OSError):  # pragma: no cover
                pass
