"""``perseus_client.measurements``: an iteration's record and its resolution off the hot path.

CUDA events stand in as small objects with ``synchronize`` and ``elapsed_time`` (milliseconds, as
torch's): no GPU here. The end-to-end CUDA-event path is ``integrations/test_timing_cuda_events.py``.
"""

from __future__ import annotations

import pytest

from perseus_client.measurements import (
    TRANSFER_DIRECTIONS,
    EventTiming,
    InstructionMeasurement,
    IterationMeasurement,
)


class Event:
    """A recorded CUDA event: its time in milliseconds; remembers being waited on."""

    def __init__(self, ms: float) -> None:
        self.ms = ms
        self.synchronized = False

    def synchronize(self) -> None:
        self.synchronized = True

    def elapsed_time(self, end: Event) -> float:
        return end.ms - self.ms


FORWARD = InstructionMeasurement("forward", 0, 0, 1410, 0.5, 3.0)
BACKWARD = InstructionMeasurement("backward", 0, 0, 1200, 0.7, 5.0)


def test_the_instructions_are_built_once_by_their_first_reader() -> None:
    calls: list[int] = []

    def build() -> tuple[InstructionMeasurement, ...]:
        calls.append(1)
        return (FORWARD, BACKWARD)

    rec = IterationMeasurement(3, 1.2, 1, 8.0, build)
    assert rec.instructions == (FORWARD, BACKWARD)
    assert rec.instructions == (FORWARD, BACKWARD)
    assert calls == [1] and rec.recorded == (FORWARD, BACKWARD)


def test_a_record_without_events_is_already_resolved() -> None:
    rec = IterationMeasurement(3, 1.2, 1, 8.0, (FORWARD,), transfers=((0, "forward", 0, 0.01),))
    assert rec.resolved() is rec


def test_event_times_replace_instruction_and_transfer_times() -> None:
    pairs = ((Event(0.0), Event(20.0)), (Event(20.0), Event(50.0)))
    timing = EventTiming(Event(5.0), Event(6.5))
    rec = IterationMeasurement(
        3,
        1.2,
        1,
        8.0,
        (FORWARD, BACKWARD),
        cuda_events=pairs,
        transfers=((0, "forward", 0, timing), (1, "backward", 0, 0.25)),
    )
    out = rec.resolved()
    assert [m.time for m in out.instructions] == [pytest.approx(0.02), pytest.approx(0.03)]
    assert [m.energy for m in out.instructions] == [3.0, 5.0]  # only times change
    assert out.transfers == ((0, "forward", 0, pytest.approx(0.0015)), (1, "backward", 0, 0.25))
    assert out.cuda_events == () and all(end.synchronized for _, end in pairs)
    assert timing.end.synchronized
    assert rec.instructions[0].time == 0.5  # the record itself is unchanged (frozen)


def test_events_that_do_not_match_the_instructions_are_refused() -> None:
    rec = IterationMeasurement(3, 1.2, 1, 8.0, (FORWARD, BACKWARD), cuda_events=((1, 2),))
    with pytest.raises(ValueError, match="cuda_events: 1 pairs for 2 instructions"):
        rec.resolved()


def test_event_timing_is_seconds_and_directions_are_two() -> None:
    assert EventTiming(Event(1.0), Event(251.0)).seconds() == pytest.approx(0.25)
    assert TRANSFER_DIRECTIONS == ("forward", "backward")
