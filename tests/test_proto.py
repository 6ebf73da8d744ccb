"""The committed gRPC stubs are exactly what ``scripts/gen_proto.py`` generates from the .proto."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
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
