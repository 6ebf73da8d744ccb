"""Clock reset on every exit path: SIGTERM/SIGINT handlers and an ``atexit`` hook.

:class:`ResetGuard` installs, for one client, a handler for SIGTERM and SIGINT that first resets
the GPU clocks (synchronously, in the handler) and then does what the previous handler would
have done: call it if it was a Python function, raise ``KeyboardInterrupt`` for a default SIGINT,
or restore the default disposition and re-send the signal (so the process still dies of SIGTERM,
with the exit status supervisors expect). It also registers an ``atexit`` hook for a normal
interpreter exit without ``client.close()``.

Python runs signal handlers on the main thread between bytecodes; a main thread stuck inside a
long C call (a collective that never returns) runs the handler only when that call returns, and
SIGKILL, the OOM killer, a segfault or a container stop cannot be caught by the process at all.
For those, run the node daemon ``perseus gpud`` and let the client use
:class:`~perseus_client.gpu.daemon.DaemonGpu` (the default when the daemon's socket exists): the
daemon resets a GPU as soon as its holder's connection closes, whatever killed the holder, or
when the holder stops heartbeating (see ``docs/gpud.md``). Without the daemon, put
``nvidia-smi -rgc`` in the job's epilogue.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

__all__ = ["ResetGuard"]

log = logging.getLogger("perseus_client.safety")

_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class ResetGuard:
    """Calls ``reset`` on SIGTERM/SIGINT and at interpreter exit, then chains (see module doc)."""

    def __init__(self, reset: Callable[[], None], *, signals: bool = True) -> None:
        self._reset = reset
        self._previous: dict[int, Any] = {}
        self._active = True
        if signals:
            if threading.current_thread() is threading.main_thread():
                for sig in _SIGNALS:
                    try:
                        self._previous[sig] = signal.signal(sig, self._handle)
                    except (ValueError, OSError) as exc:  # pragma: no cover - exotic platforms
                        log.debug("perseus: cannot handle signal %s: %s", sig, exc)
            else:
                log.warning(
                    "perseus: client created outside the main thread; SIGTERM/SIGINT will not "
                    "reset GPU clocks (create it on the main thread, or reset clocks in your handler)"
                )
        atexit.register(self._at_exit)

    def _at_exit(self) -> None:
        if self._active:
            self._reset()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._active:
            try:
                self._reset()
            except Exception:  # noqa: BLE001 - must still chain
                log.exception("perseus: clock reset on signal %s failed", signum)
        prev = self._previous.get(signum, signal.SIG_DFL)
        if callable(prev):
            prev(signum, frame)
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
