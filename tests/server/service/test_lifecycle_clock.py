"""The lifecycle measures its idle timeout on the monotonic clock.

And its timer looks again when a check finds the time not yet up (issue #32 item 6: after a -3,600 s
step of the system clock a job whose ranks had all left stayed ``active``). The clocks are injected:
a fake ``time`` module for the module, a fake monotonic and wall clock for the object.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from perseus_server.config import Limits
from perseus_server.domain.jobs import JobSpec
from perseus_server.domain.states import JobActivity
from perseus_server.runtime.sql_store import SqlStore
from perseus_server.service import PerseusService
from perseus_server.service import lifecycle as lifecycle_module

IDLE_AFTER = 0.05


class Clocks:
    """A wall clock that an operator (or NTP) may step, and a monotonic one that only moves forward.

    Both moved by the test alone.
    """

    def __init__(self) -> None:
        self.wall, self.mono = 1.7e9, 1000.0

    def time(self) -> float:
        return self.wall

    def monotonic(self) -> float:
        return self.mono

    def advance(self, seconds: float, step: float = 0.0) -> None:
        self.mono += seconds
        self.wall += seconds + step


@pytest.fixture
def clocks(monkeypatch: pytest.MonkeyPatch) -> Clocks:
    c = Clocks()
    monkeypatch.setattr(lifecycle_module, "time", c)
    return c


@pytest.fixture
def service(tmp_path: Path, clocks: Clocks) -> Iterator[PerseusService]:
    store = SqlStore.open(tmp_path / "life.db")
    try:
        svc = PerseusService(store, Limits(idle_after_seconds=IDLE_AFTER))
        svc.lifecycle.clock, svc.lifecycle.wall = clocks.monotonic, clocks.time
        yield svc
    finally:
        store.close()


def _job(service: PerseusService) -> str:
    return str(service.create_job(JobSpec(stages=2, microbatches=4, blocking_power=70.0))["id"])


def test_a_backward_step_of_the_wall_clock_does_not_freeze_the_idle_timeout(
    service: PerseusService, clocks: Clocks
) -> None:
    job = _job(service)
    service.lifecycle.connected(job)
    service.lifecycle.disconnected(job)  # its last rank left
    clocks.advance(IDLE_AFTER + 1, step=-3600.0)
    view = service.lifecycle.view(job)
    assert view["state"] == JobActivity.IDLE, view
    assert view["since"] == clocks.wall  # dated on the wall clock, stepped or not


def test_a_forward_step_does_not_hasten_it(service: PerseusService, clocks: Clocks) -> None:
    job = _job(service)
    service.lifecycle.disconnected(job)
    clocks.advance(IDLE_AFTER / 2, step=+3600.0)
    view = service.lifecycle.view(job)
    assert view["state"] == JobActivity.ACTIVE, view
    assert view["idle_at"] == pytest.approx(clocks.wall + IDLE_AFTER / 2)


def test_the_idle_timer_looks_again_when_the_time_is_not_yet_up(
    service: PerseusService, clocks: Clocks
) -> None:
    async def scenario() -> JobActivity:
        job = _job(service)
        service.lifecycle.disconnected(job)  # the timer is set on the loop
        # The loop's timer fires while the (injected) clock says the time is not up yet.
        await asyncio.sleep(IDLE_AFTER * 4)
        assert service.lifecycle.state(job) is JobActivity.ACTIVE
        clocks.advance(IDLE_AFTER + 1)
        for _ in range(100):  # the timer set again makes it idle, with no read to check it
            await asyncio.sleep(IDLE_AFTER)
            if service.lifecycle.state(job) is JobActivity.IDLE:
                break
        return service.lifecycle.state(job)

    assert asyncio.run(scenario()) is JobActivity.IDLE
