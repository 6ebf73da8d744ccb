"""``perseus_common.wire.codec``: what the codec refuses, repairs or leaves off the wire.

Every field of every message round-trips through it in ``test_values_round_trip.py``; here, the
cases a round trip of good values never meets.
"""

from __future__ import annotations

import pytest

from perseus_common.proto import perseus_pb2 as pb
from perseus_common.wire import codec
from perseus_common.wire import values as wire


def test_an_unknown_clock_control_state_decodes_as_a_question_mark() -> None:
    msg = pb.RegisterRankRequest(job_id="j", clock_control=pb.ClockControl(state=7, reason="x"))
    reg = codec.decode_registration(pb.RegisterRankRequest.FromString(msg.SerializeToString()))
    assert (reg.clock_control, reg.clock_control_reason) == ("?", "x")
    # Nothing said: no ClockControl on the wire at all.
    assert not codec.encode_registration(wire.RankRegistration("j", 0, 0, 0)).HasField(
        "clock_control"
    )


def test_a_plan_drops_floors_that_are_not_floors() -> None:
    """NaN, negative, empty or zero-watt floors from a server are dropped, never applied."""
    msg = pb.PlanUpdate(version=3, plan_swing=float("nan"))
    for a, b, w in [(0.0, 0.5, 300.0), (0.2, 0.1, 300.0), (-1.0, 0.5, 300.0),
                    (0.0, float("nan"), 300.0), (0.0, 0.5, 0.0), (1.0, 2.0, float("inf"))]:  # fmt: skip
        msg.power_floors.append(pb.PowerFloor(start_s=a, end_s=b, watts=w))
    got = codec.decode_plan(pb.PlanUpdate.FromString(msg.SerializeToString()))
    assert got.power_floors == ((0.0, 0.5, 300.0),) and got.plan_swing == 0.0


def test_flat_codec_refuses_a_message_that_is_not_flat_or_not_the_values() -> None:
    """A nested message, or a field the value lacks, is refused rather than dropped."""
    with pytest.raises(TypeError, match=r"PlanUpdate\.steps"):
        codec.decode_flat(pb.PlanUpdate(version=1), wire.PlanUpdate)
    with pytest.raises(TypeError, match=r"WatchPlanRequest\.known_version"):
        codec.encode_flat(wire.FinishRank("j", "r"), pb.WatchPlanRequest)
    got = codec.decode_flat(pb.FinishRankRequest(job_id="j", rank_id="r"), wire.PlanRequest)
    assert got == wire.PlanRequest("j", "r", 0)  # a field the message lacks keeps its default
