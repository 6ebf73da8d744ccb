"""The client tests' small profile data and plan helper, by a name no other test folder uses.

The test files import them from here, not from ``conftest`` (a module name every test folder
has: whichever folder's was imported first would answer).
"""

from __future__ import annotations

import threading
from typing import Any

from perseus_common.wire.values import PlanStep, PlanUpdate

# A tiny two-stage profile: (stage, kind) -> {MHz: (seconds, joules)}.
PROFILE: dict[tuple[int, str], dict[int, tuple[float, float]]] = {
    (0, "forward"): {1410: (0.010, 3.0), 1200: (0.012, 2.6), 1000: (0.015, 2.4)},
    (0, "backward"): {1410: (0.020, 6.0), 1200: (0.024, 5.2), 1000: (0.030, 4.8)},
    (1, "forward"): {1410: (0.011, 3.3), 1200: (0.013, 2.9), 1000: (0.016, 2.7)},
    (1, "backward"): {1410: (0.022, 6.6), 1200: (0.026, 5.7), 1000: (0.033, 5.3)},
}

PROFILE_CSV = "stage,instruction,frequency,time,energy\n" + "".join(
    f"{s},{k},{f},{t},{e}\n" for (s, k), pts in PROFILE.items() for f, (t, e) in pts.items()
)


def steps_plan(
    version: int, steps: list[tuple[str, int, int]], stage: int = 0, **kw: Any
) -> PlanUpdate:
    """A plan from ``(kind, microbatch, mhz)`` triples."""
    return PlanUpdate(version, tuple(PlanStep(k, m, f, stage) for k, m, f in steps), **kw)


#: A backoff's initial delay and maximum, far enough apart that doubling and jumping to the
#: maximum differ (issue #32), and the waits it makes: 0.02, 0.04, ... 5.12, then the maximum.
BACKOFF_INITIAL, BACKOFF_MAXIMUM = 0.01, 10.0
BACKOFF_EXPECTED = [min(BACKOFF_INITIAL * 2**i, BACKOFF_MAXIMUM) for i in range(13)]


class RecordingEvent(threading.Event):
    """An event whose timed waits are recorded and return at once; set after ``n`` of them."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n
        self.waits: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        if timeout is None:
            return super().wait()
        self.waits.append(timeout)
        if len(self.waits) >= self.n:
            self.set()
        return self.is_set()


#: A two-microbatch plan for stage 0 as ``(kind, microbatch, mhz)``, and its order.
STEPS: list[tuple[str, int, int]] = [
    ("forward", 0, 1200),
    ("forward", 1, 1000),
    ("backward", 0, 1410),
    ("backward", 1, 1200),
]
ORDER = [(k, m) for k, m, _ in STEPS]


def run_iteration(
    client: Any, order: list[tuple[str, int]] = ORDER, stage: int | None = None
) -> None:
    """One iteration of ``order``'s instructions through ``client``, doing nothing in each."""
    with client.iteration():
        for k, m in order:
            with client.instruction(k, microbatch=m, stage=stage):
                pass
