"""The wire values (``perseus_common.wire.values``): one per message that needs one, round-tripped.

Every ``perseus.v1`` message that is not flat has one value class in :mod:`perseus_common.wire`
with its fields, and decoding what the other end encoded gives back the value, field for field
(hypothesis over every field of every message with a value, through the bytes). A flat message
(scalar and repeated scalar fields only) needs no value: where it has one, the flat codec
converts it; where it has none, its receiver reads the message's own typed fields.

The last tests cross the ends as they run: the rank client's report builder encodes, the
server's adapter decodes (its per-object and its columnar decoder), and the other way round for
plans and registrations. The codec's own refusals and repairs are ``test_codec.py``'s.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from perseus_client.gpu.applied import AppliedClockReport
from perseus_client.measurements import InstructionMeasurement, IterationMeasurement
from perseus_client.plan import compile_plan, received_plan
from perseus_client.reports import report_message, report_value
from perseus_common.proto import perseus_pb2 as pb
from perseus_common.wire import codec
from perseus_common.wire import values as wire
from perseus_server.grpc.plan_encoder import PlanEncoder
from perseus_server.grpc.report_decoder import decode_report_bytes, decode_report_columns

INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
DOUBLE = st.floats(allow_nan=False)
TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)
SMALL = st.integers(0, 4)
STATE = st.sampled_from(wire.CLOCK_CONTROL_STATES)
#: A power floor as the server sends one: within an iteration, a positive wattage.
FLOOR = st.tuples(st.floats(0, 100), st.floats(1e-3, 10), st.floats(1e-3, 2000)).map(
    lambda f: (f[0], f[0] + f[1], f[2])
)


def _tuple(s: st.SearchStrategy[Any]) -> st.SearchStrategy[tuple[Any, ...]]:
    return st.lists(s, max_size=4).map(tuple)


PLAN_STEP = st.builds(wire.PlanStep, TEXT, INT32, INT32, INT32)
PROFILING = st.builds(wire.ProfilingTask, INT32, INT32, INT32)
INSTRUCTION = st.builds(wire.InstructionReport, TEXT, INT32, INT32, DOUBLE, DOUBLE, INT32)
TRANSFER = st.builds(wire.TransferReport, INT32, TEXT, INT32, DOUBLE)
OFF_PLAN = st.builds(
    wire.OffPlanReport, TEXT, INT32, st.none() | INT32, INT32, INT32, _tuple(TEXT), INT32
)

#: Each message's value and a strategy drawing it with every field random.
VALUES: dict[str, st.SearchStrategy[Any]] = {
    "RegisterRankRequest": st.builds(
        wire.RankRegistration,
        job_id=TEXT,
        global_rank=INT32,
        pipeline_rank=INT32,
        data_rank=INT32,
        tensor_rank=INT32,
        gpu_name=TEXT,
        supported_clocks_mhz=_tuple(INT32),
        hostname=TEXT,
        max_power_limit_w=DOUBLE,
        clock_control=STATE,
        clock_control_reason=TEXT,
    ),
    "RegisterRankResponse": st.builds(wire.RegisteredRank, TEXT, INT64, INT32, INT32, INT32),
    "WatchPlanRequest": st.builds(wire.PlanRequest, TEXT, TEXT, INT64),
    "PlanUpdate": st.builds(
        wire.PlanUpdate,
        INT64,
        _tuple(PLAN_STEP),
        TEXT,
        DOUBLE,
        st.none() | PROFILING,
        _tuple(FLOOR),
        st.floats(0, 1),
        st.floats(0, 1e6),
    ),
    "IterationReport": st.builds(
        wire.IterationReport,
        job_id=TEXT,
        rank_id=TEXT,
        iteration=INT64,
        iteration_time=DOUBLE,
        plan_version=INT64,
        instructions=_tuple(INSTRUCTION),
        energy=DOUBLE,
        sequence=INT64,
        off_plan=_tuple(OFF_PLAN),
        clock_samples=INT32,
        clock_event_reasons=_tuple(TEXT),
        incarnation=INT64,
        clock_control=STATE,
        clock_control_reason=TEXT,
        transfers=_tuple(TRANSFER),
        power_floor=st.sampled_from(("", "held", "unavailable")),
        power_floor_reason=TEXT,
        power_floor_swing=st.floats(0, 1),
    ),
    "ReportAck": st.builds(wire.ReportAck, INT64, INT64),
    "FinishRankRequest": st.builds(wire.FinishRank, TEXT, TEXT),
    "FinishRankResponse": st.builds(wire.FinishedRank, st.booleans(), INT32, INT32),
}

#: message -> (its value class, encoder, decoder); nested messages travel inside their parent.
CODECS: dict[str, tuple[type, Any, Any]] = {
    "RegisterRankRequest": (
        wire.RankRegistration,
        codec.encode_registration,
        codec.decode_registration,
    ),
    "RegisterRankResponse": (wire.RegisteredRank, codec.encode_registered, codec.decode_registered),
    "WatchPlanRequest": (wire.PlanRequest, codec.encode_plan_request, codec.decode_plan_request),
    "PlanUpdate": (wire.PlanUpdate, codec.encode_plan, codec.decode_plan),
    "IterationReport": (wire.IterationReport, codec.encode_report, codec.decode_report),
    "ReportAck": (wire.ReportAck, codec.encode_ack, codec.decode_ack),
    "FinishRankRequest": (wire.FinishRank, codec.encode_finish, codec.decode_finish),
    "FinishRankResponse": (wire.FinishedRank, codec.encode_finished, codec.decode_finished),
}
NESTED: dict[str, type | None] = {
    "PlanStep": wire.PlanStep,
    "ProfilingTask": wire.ProfilingTask,
    "InstructionMeasurement": wire.InstructionReport,
    "TransferMeasurement": wire.TransferReport,
    "OffPlanInstruction": wire.OffPlanReport,
    "ClockControl": None,  # flattened: clock_control, clock_control_reason
    "PowerFloorControl": None,  # flattened: power_floor, power_floor_reason, power_floor_swing
    "PowerFloor": None,  # a (start_s, end_s, watts) tuple in PlanUpdate.power_floors
}


def fields_of(value: Any) -> Any:
    """A value as nested tuples (plan updates compare by identity, so compare their fields)."""
    return dataclasses.astuple(value)


def _wire_fields(cls: type) -> set[str]:
    names = {f.name for f in dataclasses.fields(cls)}
    if "clock_control_reason" in names:
        names.discard("clock_control_reason")  # both travel in the one ClockControl
    if "power_floor_reason" in names:  # all three travel in the one PowerFloorControl
        names -= {"power_floor_reason", "power_floor_swing"}
    return names


def _is_flat(desc: Any) -> bool:
    return all(f.message_type is None for f in desc.fields)


def test_every_message_that_is_not_flat_has_a_value_with_exactly_its_fields() -> None:
    messages = pb.DESCRIPTOR.message_types_by_name
    valueless = set(messages) - set(CODECS) - set(NESTED)
    nested = sorted(name for name in valueless if not _is_flat(messages[name]))
    assert not nested, f"a message with message fields needs its wire value and codec: {nested}"
    assert set(VALUES) == set(CODECS)
    for name, desc in messages.items():
        cls = CODECS[name][0] if name in CODECS else NESTED.get(name)
        if cls is None:
            continue
        assert {f.name for f in desc.fields} == _wire_fields(cls), name


def test_the_flatness_check_sees_nested_fields() -> None:
    """The check above is not vacuous: a message with a message field is not flat."""
    messages = pb.DESCRIPTOR.message_types_by_name
    assert not _is_flat(messages["PlanUpdate"]) and not _is_flat(messages["IterationReport"])
    assert _is_flat(messages["FinishRankRequest"]) and _is_flat(messages["ReportAck"])


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_every_message_round_trips_through_its_bytes(data: st.DataObject) -> None:
    for name, (cls, encode, decode) in CODECS.items():
        value = data.draw(VALUES[name], label=name)
        msg = encode(value)
        assert type(msg).DESCRIPTOR.name == name
        again = decode(type(msg).FromString(msg.SerializeToString()))
        assert type(again) is cls and fields_of(again) == fields_of(value), name


@settings(max_examples=40, deadline=None)
@given(VALUES["IterationReport"])
def test_the_servers_columnar_decoder_reads_what_the_codec_encodes(
    report: wire.IterationReport,
) -> None:
    msg = codec.encode_report(report)
    assert decode_report_columns(msg) == report
    assert decode_report_bytes(msg.SerializeToString()) == report


# --- across the ends, as they run -------------------------------------------------------------

KIND = st.sampled_from(("forward", "backward", "backward_input", "backward_weight"))
MEASUREMENT = st.builds(
    InstructionMeasurement,
    KIND,
    SMALL,
    SMALL,
    st.integers(210, 2000),
    st.floats(1e-6, 10.0),
    st.floats(0.0, 1e3),
)
APPLIED = st.builds(
    AppliedClockReport,
    st.integers(1, 50),
    _tuple(
        st.builds(
            wire.OffPlanReport,
            KIND,
            SMALL,
            st.none() | SMALL,
            INT32,
            INT32,
            _tuple(TEXT),
            st.integers(1, 9),
        )
    ),
    _tuple(TEXT),
)


@settings(max_examples=40, deadline=None)
@given(
    st.builds(
        IterationMeasurement,
        st.integers(0, 2**40),
        st.floats(1e-6, 1e3),
        st.integers(0, 2**40),
        st.floats(0.0, 1e6),
        _tuple(MEASUREMENT),
        st.just(()),
        st.none() | APPLIED,
        _tuple(
            st.tuples(SMALL, st.sampled_from(("forward", "backward")), SMALL, st.floats(1e-6, 5.0))
        ),
    ),
    STATE,
    TEXT,
)
def test_a_report_the_client_builds_is_what_the_server_decodes(
    record: IterationMeasurement, state: str, reason: str
) -> None:
    fields = dict(
        job_id="job", rank_id="r-1", sequence=7, incarnation=3, clock_control=state,
        clock_control_reason=reason,
    )  # fmt: skip
    sent = report_value(record, **fields)
    msg = pb.IterationReport.FromString(report_message(record, **fields).SerializeToString())
    got = decode_report_columns(msg)
    assert got == sent
    assert [(m.instruction, m.microbatch, m.stage) for m in got.instructions] == [
        (m.kind, m.microbatch, m.stage) for m in record.instructions
    ]
    assert got.off_plan == (record.applied_clocks.off_plan if record.applied_clocks else ())
    assert len(got.transfers) == len(record.transfers)


@settings(max_examples=40, deadline=None)
@given(VALUES["PlanUpdate"])
def test_a_plan_the_server_pushes_is_the_plan_the_client_runs(update: wire.PlanUpdate) -> None:
    """The server's plan value, through its bytes, is the client's, and compiles to its clocks."""
    data = PlanEncoder()(update)
    plan = received_plan(codec.decode_plan(pb.PlanUpdate.FromString(data)))
    assert (plan.version, plan.reason, plan.expected_iteration_time) == (
        update.version,
        update.reason,
        update.expected_iteration_time,
    )
    assert plan.steps == update.steps
    assert plan.power_floors == update.power_floors and plan.plan_swing == update.plan_swing
    task = update.profiling
    if task is None or task.frequency_mhz <= 0:
        assert plan.profiling is None
    else:
        assert plan.profiling == wire.ProfilingTask(
            task.frequency_mhz, max(0, task.warmup_iterations), max(0, task.iterations)
        )
    compiled = compile_plan(plan, 1410)
    assert compiled.keys == tuple((s.instruction, s.microbatch, s.stage) for s in update.steps)
    clock = plan.profiling.frequency_mhz if plan.profiling is not None else None
    assert compiled.clocks == tuple(clock or s.frequency_mhz for s in update.steps)
