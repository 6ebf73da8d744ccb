"""The fail-open client's two backoffs double from their initial delay up to their maximum.

The maximum is large enough that doubling and jumping to the maximum differ (issue #32: a seeded bug
that jumped to the maximum after the first failure passed every test, whose maximum was twice the
initial delay). Each loop runs in the test's thread with its waits recorded, not slept.
"""

from __future__ import annotations

import threading

import grpc
import pytest

from perseus_client import FailOpenGpu
from perseus_client import transport as transport_module
from perseus_client.errors import GpudUnavailableError
from perseus_client.transport import ServerLink
from perseus_common.wire.values import RankRegistration

INITIAL, MAXIMUM = 0.01, 10.0
#: 0.01 doubling: 0.02, 0.04, ... 5.12, then the maximum.
EXPECTED = [min(INITIAL * 2**i, MAXIMUM) for i in range(13)]


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


class _Stepped(FailOpenGpu):
    def _run(self) -> None:  # its thread does nothing: the test runs the loop itself
        return


def _never() -> FailOpenGpu:
    raise GpudUnavailableError("cannot reach the Perseus node daemon at /x: No such file")


def test_clock_control_retries_double_up_to_their_maximum() -> None:
    gpu = _Stepped(_never, retry_initial=INITIAL, retry_max=MAXIMUM)  # type: ignore[arg-type]
    gpu._closing = RecordingEvent(len(EXPECTED))
    FailOpenGpu._run(gpu)
    assert gpu._closing.waits == pytest.approx(EXPECTED)
    gpu.close()


class _Unavailable(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "connection refused"


def test_the_plan_streams_reconnects_double_up_to_their_maximum(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(transport_module.random, "uniform", lambda lo, hi: hi)  # no jitter
    link = ServerLink(
        "127.0.0.1:9",
        RankRegistration("j", 0, 0, 0, 0, "", (), "test"),
        lambda plan: None,
        backoff_initial=INITIAL,
        backoff_max=MAXIMUM,
    )

    def refused() -> None:
        raise _Unavailable()

    link._register = refused  # type: ignore[method-assign]
    link._stop = RecordingEvent(len(EXPECTED))
    link._watch_loop()
    assert link._stop.waits == pytest.approx(EXPECTED)
    link._channel.close()
