"""``perseus_client.plan_watch``: the plan stream's reconnects double up to their maximum.

The clock control's retries are ``test_clock_control.py``'s. The maximum is large enough that doubling and jumping to the maximum differ (issue #32: a seeded bug
that jumped to the maximum after the first failure passed every test, whose maximum was twice the
initial delay). The loop runs in the test's thread with its waits recorded, not slept.
"""

from __future__ import annotations

import random

import grpc
import pytest
from client_data import BACKOFF_EXPECTED as EXPECTED
from client_data import BACKOFF_INITIAL as INITIAL
from client_data import BACKOFF_MAXIMUM as MAXIMUM
from client_data import RecordingEvent

from perseus_client.transport import ServerLink
from perseus_common.wire.values import RankRegistration


class _Unavailable(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "connection refused"


def test_the_plan_streams_reconnects_double_up_to_their_maximum(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(random, "uniform", lambda lo, hi: hi)  # no jitter
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
