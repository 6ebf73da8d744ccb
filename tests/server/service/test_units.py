"""Unit tests of the service's pure parts.

The straggler filter of a slow stage's recovery and the codec between
the service's plain values and protobuf.
"""

from __future__ import annotations

from perseus_common.proto import perseus_pb2 as pb
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
from perseus_server.decisions.planner import Straggler
from perseus_server.domain.states import StragglerSource
from perseus_server.grpc.plan_encoder import PlanEncoder
from perseus_server.grpc.service import serialized
from perseus_server.service.slow_stages import drop_slow_stage_straggler


def test_drop_slow_stage_straggler_keeps_other_sources_and_pipelines() -> None:
    stragglers = {
        0: Straggler(0, 2.0, StragglerSource.SLOW_STAGE, "stage 1 x1.3"),
        1: Straggler(1, 2.5, StragglerSource.SLOW_STAGE, "stage 0 x1.5"),
        2: Straggler(2, 3.0, StragglerSource.REPORTED),
        3: Straggler(3, 3.5, StragglerSource.DETECTED),
    }
    assert drop_slow_stage_straggler(stragglers, 0) == {p: stragglers[p] for p in (1, 2, 3)}
    assert drop_slow_stage_straggler(stragglers, 2) == stragglers
    assert drop_slow_stage_straggler(stragglers, 3) == stragglers


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


def test_responses_go_out_as_given_bytes_or_serialized() -> None:
    msg = pb.ReportAck(accepted=3)
    assert serialized(msg) == msg.SerializeToString()
    data = PlanEncoder()(PlanUpdate(4, (), "r"))
    assert serialized(data) is data


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
