"""The committed stubs (gRPC and the node daemon's messages) are exactly what ``scripts/gen_proto.py`` generates from the .proto."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STUBS = ROOT / "common" / "perseus_common" / "proto"


def _load_generator():
    spec = importlib.util.spec_from_file_location("gen_proto", ROOT / "scripts" / "gen_proto.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_stubs_are_current(tmp_path: Path) -> None:
    written = _load_generator().generate(tmp_path)
    assert {p.name for p in written} == {
        "perseus_pb2.py",
        "perseus_pb2.pyi",
        "perseus_pb2_grpc.py",
        "perseus_pb2_grpc.pyi",
        "gpud_pb2.py",
        "gpud_pb2.pyi",
    }
    for path in written:
        committed = STUBS / path.name
        assert committed.read_text() == path.read_text(), (
            f"{committed} is stale; run `python scripts/gen_proto.py`"
        )


def test_stubs_import_and_round_trip() -> None:
    from perseus_common.proto import perseus_pb2, perseus_pb2_grpc

    update = perseus_pb2.PlanUpdate(version=3, reason="default")
    update.steps.add(instruction="forward", microbatch=1, frequency_mhz=1410, stage=0)
    again = perseus_pb2.PlanUpdate.FromString(update.SerializeToString())
    assert again.version == 3 and again.steps[0].frequency_mhz == 1410
    assert not again.HasField("profiling")
    assert hasattr(perseus_pb2_grpc, "PlanServiceStub")


def test_gpud_messages_round_trip() -> None:
    from perseus_common.proto import gpud_pb2

    request = gpud_pb2.Request(id=7, set_clock=gpud_pb2.SetClock(index=1, mhz=1200))
    again = gpud_pb2.Request.FromString(request.SerializeToString())
    assert again.id == 7 and again.WhichOneof("call") == "set_clock"
    assert again.set_clock.index == 1 and again.set_clock.mhz == 1200
    state = gpud_pb2.ClockState(index=1)
    assert not gpud_pb2.ClockState.FromString(state.SerializeToString()).HasField("locked_mhz")
    refused = gpud_pb2.Response(id=7, error=gpud_pb2.Error(code=gpud_pb2.LEASE_HELD, message="x"))
    back = gpud_pb2.Response.FromString(refused.SerializeToString())
    assert back.HasField("error") and back.error.code == gpud_pb2.LEASE_HELD
    assert back.WhichOneof("result") is None


def test_off_plan_instructions_round_trip_and_old_reports_have_none() -> None:
    from perseus_common.proto import perseus_pb2

    report = perseus_pb2.IterationReport(job_id="j", iteration=4, clock_samples=12)
    report.clock_event_reasons.append("hw_thermal_slowdown")
    report.off_plan.add(
        instruction="backward",
        microbatch=2,
        locked_mhz=1410,
        sampled_mhz=1005,
        reasons=["hw_thermal_slowdown"],
        samples=3,
    )
    again = perseus_pb2.IterationReport.FromString(report.SerializeToString())
    [off] = again.off_plan
    assert (off.instruction, off.microbatch, off.locked_mhz, off.sampled_mhz) == (
        "backward",
        2,
        1410,
        1005,
    )
    assert not off.HasField("stage") and list(off.reasons) == ["hw_thermal_slowdown"]
    assert again.clock_samples == 12 and list(again.clock_event_reasons) == ["hw_thermal_slowdown"]
    old = perseus_pb2.IterationReport.FromString(
        perseus_pb2.IterationReport(job_id="j", iteration=1).SerializeToString()
    )
    assert list(old.off_plan) == [] and old.clock_samples == 0
