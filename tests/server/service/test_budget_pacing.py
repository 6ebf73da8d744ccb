"""The pace of the power budget's recomputations (``service/budget_pacing.py``).

The pacer's ``run`` is the budget's ``recompute``, which first tells the pacer it ``covered``
every change merged so far; each test's ``run`` does the same.
"""

from __future__ import annotations

import asyncio

import pytest

from perseus_server.service.budget_pacing import Pacer


def _pacer(interval: float, runs: list[tuple[str, str | None]], fail: bool = False) -> Pacer:
    def run(cause: str, skip: str | None) -> None:
        pacer.covered()
        runs.append((cause, skip))
        if fail:
            raise RuntimeError("boom")

    pacer = Pacer(lambda: interval, run)
    return pacer


def test_without_a_loop_every_request_runs_at_once() -> None:
    runs: list[tuple[str, str | None]] = []
    pacer = _pacer(3600.0, runs)
    pacer.request("job a registered", skip="a")
    pacer.request("job b registered")
    assert runs == [("job a registered", "a"), ("job b registered", None)]


def test_requests_within_the_interval_merge_into_one_run_at_its_end() -> None:
    runs: list[tuple[str, str | None]] = []

    async def body() -> None:
        pacer = _pacer(0.2, runs)
        pacer.request("first", skip="a")
        assert runs == [("first", "a")]  # the first change: at once, its skip handed on
        for cause in ("second", "third", "fourth"):
            pacer.request(cause, skip="b")
        assert len(runs) == 1
        await asyncio.sleep(0.6)
        # merged: the last cause named, the others counted; no skip (each job is re-decided)
        assert runs == [("first", "a"), ("fourth (and 2 more)", None)]
        pacer.request("later")  # an interval after the last run: at once again
        assert runs[-1] == ("later", None)

    asyncio.run(body())


def test_a_recomputation_for_another_reason_covers_the_pending_one() -> None:
    runs: list[tuple[str, str | None]] = []

    async def body() -> None:
        pacer = _pacer(0.2, runs)
        pacer.request("first")
        pacer.request("second")
        pacer.covered()  # the admin's recomputation ran meanwhile
        await asyncio.sleep(0.6)
        assert runs == [("first", None)]

    asyncio.run(body())


def test_a_failing_recomputation_is_logged_and_the_pacer_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    runs: list[tuple[str, str | None]] = []
    pacer = _pacer(0.0, runs, fail=True)
    pacer.request("a")
    pacer.request("b")
    assert runs == [("a", None), ("b", None)]
    assert "power budget: recomputation failed (a)" in caplog.text
