"""``perseus_common.wire.codec``: what the codec refuses, repairs or leaves off the wire.

Every field of every message round-trips through it in ``test_values_round_trip.py``; here, the
cases a round trip of good values never meets.
"""

from __future__ import annotations

import pytest

from perseus_common.proto import perseus_pb2 as pb
from perseus_common.wire import codec
from perseus_common.wire import values as wire
from perseus_common.wire.codec import (
    decode_registration,
    decode_report,
    encode_plan,
    encode_registered,
)
from perseus_common.wire.values import (
    PlanStep,
    PlanUpdate,
    ProfilingTask,
    RankRegistration,
    RegisteredRank,
)


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


def test_plan_update_encodes_as_the_wire_message() -> None:
    update = PlanUpdate(
        version=7,
        steps=(PlanStep("forward", 0, 1410, 0), PlanStep("backward", 0, 1200, 1)),
        reason="default: fastest plan (point 0)",
        expected_iteration_time=0.25,
    )
    want = pb.PlanUpdate(
        version=7,
        reason="default: fastest plan (point 0)",
        expected_iteration_time=0.25,
        steps=[
            pb.PlanStep(instruction="forward", microbatch=0, frequency_mhz=1410, stage=0),
            pb.PlanStep(instruction="backward", microbatch=0, frequency_mhz=1200, stage=1),
        ],
    )
    got = encode_plan(update)
    assert got.SerializeToString() == want.SerializeToString()
    assert not got.HasField("profiling")

    prof = PlanUpdate(
        3, (PlanStep("forward", 1, 900, 0),), "profiling", 0.0, ProfilingTask(900, 2, 5)
    )
    msg = encode_plan(prof)
    assert msg.HasField("profiling") and msg.profiling.iterations == 5
    assert msg.profiling.frequency_mhz == 900 and msg.profiling.warmup_iterations == 2


def test_registration_and_reports_decode() -> None:
    req = pb.RegisterRankRequest(
        job_id="j",
        global_rank=3,
        pipeline_rank=1,
        data_rank=1,
        tensor_rank=0,
        gpu_name="NVIDIA A40",
        supported_clocks_mhz=[1740, 1410],
        hostname="h",
    )
    assert decode_registration(req) == RankRegistration(
        "j", 3, 1, 1, 0, "NVIDIA A40", (1740, 1410), "h"
    )
    resp = encode_registered(RegisteredRank("j-3-ab", 4, 2, 8, 1740))
    assert resp == pb.RegisterRankResponse(
        rank_id="j-3-ab", plan_version=4, stages=2, microbatches=8, max_clock_mhz=1740
    )
    rep = pb.IterationReport(
        job_id="j",
        rank_id="r",
        iteration=9,
        iteration_time=0.5,
        plan_version=4,
        energy=12.0,
        instructions=[
            pb.InstructionMeasurement(
                instruction="forward",
                microbatch=2,
                frequency_mhz=1410,
                time=0.01,
                energy=1.5,
                stage=1,
            )
        ],
    )
    value = decode_report(rep)
    assert (value.iteration, value.iteration_time, value.plan_version, value.energy) == (
        9,
        0.5,
        4,
        12.0,
    )
    (m,) = value.instructions
    assert (m.instruction, m.microbatch, m.frequency_mhz, m.time, m.energy, m.stage) == (
        "forward",
        2,
        1410,
        0.01,
        1.5,
        1,
    )
