"""``perseus_client.integrations._torch_p2p``: the two hooks that time pipelining's P2P transfers.

The install and removal are checked on torch's real ``schedules`` module; the hooks' bookkeeping
on plain functions standing in for torch's ``_batch_p2p`` (which returns the works) and
``_wait_batch_p2p``. The transfers real schedules run over gloo are
``test_torch_pipelining_transfers.py``'s.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from perseus_client.integrations import _torch_p2p
from perseus_client.measurements import EventTiming

schedules = pytest.importorskip("torch.distributed.pipelining.schedules")


@pytest.fixture
def hooks() -> Iterator[tuple[Any, Any, list[tuple[Any, ...]]]]:
    """``(batch, wait, calls)``: the hooks around recording originals."""
    calls: list[tuple[Any, ...]] = []

    def batch(ops: Any) -> list[Any]:
        calls.append(("post", len(ops)))
        return [object()] if ops else []

    def wait(works: Any) -> str:
        calls.append(("wait", len(works)))
        return "waited"

    yield _torch_p2p._make_batch(batch), _torch_p2p._make_wait(wait), calls
    _torch_p2p._posted.clear()


def tagged(record: Any, boundary: int, direction: str, microbatch: int, event: Any = None) -> Any:
    op = SimpleNamespace()
    setattr(op, _torch_p2p.TAG, (record, boundary, direction, microbatch, event))
    return op


def test_acquire_installs_the_hooks_once_and_the_last_release_removes_them() -> None:
    original = schedules._batch_p2p, schedules._wait_batch_p2p
    _torch_p2p.acquire()
    _torch_p2p.acquire()  # a second instrumented schedule
    try:
        assert getattr(schedules._batch_p2p, "_perseus_hook", False)
        assert getattr(schedules._wait_batch_p2p, "_perseus_hook", False)
        _torch_p2p.release()
        assert getattr(schedules._batch_p2p, "_perseus_hook", False)  # one user left
    finally:
        _torch_p2p.release()
    assert (schedules._batch_p2p, schedules._wait_batch_p2p) == original
    _torch_p2p.release()  # one too many: nothing happens
    assert (schedules._batch_p2p, schedules._wait_batch_p2p) == original


def test_a_tagged_transfer_is_recorded_when_its_wait_returns(hooks) -> None:
    batch, wait, calls = hooks
    got: list[tuple[Any, ...]] = []
    works = batch([tagged(lambda *a: got.append(a), 1, "forward", 3)])
    time.sleep(0.01)
    assert got == []  # posted, not yet waited on
    assert wait(works) == "waited"
    [(boundary, direction, microbatch, seconds)] = got
    assert (boundary, direction, microbatch) == (1, "forward", 3) and seconds >= 0.01
    assert calls == [("post", 1), ("wait", 1)]
    assert _torch_p2p._posted == {}


def test_several_tensors_of_one_transfer_are_recorded_once(hooks) -> None:
    batch, wait, _ = hooks
    got: list[tuple[Any, ...]] = []

    def record(*a: Any) -> None:
        got.append(a)

    tag = (record, 0, "backward", 2, None)
    ops = [SimpleNamespace(), SimpleNamespace(), SimpleNamespace()]
    for op in ops[:2]:
        setattr(op, _torch_p2p.TAG, tag)
    wait(batch(ops))  # two tensors of one transfer and an untagged op
    assert [a[:3] for a in got] == [(0, "backward", 2)]


def test_untagged_ops_pass_straight_through(hooks) -> None:
    batch, wait, calls = hooks
    works = batch([SimpleNamespace()])
    assert _torch_p2p._posted == {}
    assert wait(works) == "waited"
    assert calls == [("post", 1), ("wait", 1)]


class Event:
    def __init__(self) -> None:
        self.at = 0.0

    def record(self) -> None:
        self.at = time.perf_counter()


def test_with_events_the_time_is_an_event_pair(hooks) -> None:
    batch, wait, _ = hooks
    got: list[tuple[Any, ...]] = []
    wait(batch([tagged(lambda *a: got.append(a), 0, "forward", 0, Event)]))
    [(_, _, _, seconds)] = got
    assert isinstance(seconds, EventTiming)
    assert seconds.end.at >= seconds.start.at > 0


def test_works_never_waited_on_are_forgotten_past_a_bound(hooks) -> None:
    batch, _, _ = hooks
    for _ in range(_torch_p2p._MAX_POSTED + 2):
        batch([tagged(lambda *a: None, 0, "forward", 0)])
    assert len(_torch_p2p._posted) <= _torch_p2p._MAX_POSTED + 1
