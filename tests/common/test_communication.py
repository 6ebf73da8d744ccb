"""Communication in profiles.

Transfer and phase rows in CSV and JSON, the dataclasses' API, and every validation error naming its
row and field; compute-only profiles keep their meaning.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perseus.errors import ProfileError
from perseus.profiles import load_profile, parse_profile_csv, parse_profile_json
from perseus_common import profile_csv
from perseus_common.communication import Communication, Phase, Transfer
from perseus_common.profile_csv import ProfileFormatError

HEADER = "stage,instruction,frequency,time,energy\n"
COMPUTE = [
    "0,forward,1400,0.010,3.0",  # 2
    "0,forward,1000,0.014,2.5",  # 3
    "0,backward,1400,0.020,6.0",  # 4
    "0,backward,1000,0.028,5.0",  # 5
    "1,forward,1400,0.011,3.3",  # 6
    "1,forward,1000,0.015,2.8",  # 7
    "1,backward,1400,0.022,6.6",  # 8
    "1,backward,1000,0.030,5.5",  # 9
]
COMM = [
    "0,transfer_forward,,0.002,",  # 10
    "0,transfer_backward,1400,0.0025,0.5",  # 11
    "0,transfer_backward,1000,0.003,0.6",  # 12
    "1,phase:allreduce,,0.004,",  # 13
    "1,phase:optimizer,1400,0.010,2.0",  # 14
    "1,phase:optimizer,1000,0.012,",  # 15
]


def csv_of(*rows: str) -> str:
    return HEADER + "\n".join(rows) + "\n"


def test_csv_rows_become_transfers_and_phases() -> None:
    p = parse_profile_csv(csv_of(*COMPUTE, *COMM))
    c = p.communication
    assert c.transfer(0, "forward") == Transfer(0.002)
    back = c.transfer(0, "backward")
    assert back is not None
    assert back.time == 0.0025  # the highest clock's
    assert back.power == pytest.approx(200.0)  # energy / time of that row
    assert back.times_by_clock == {1400: 0.0025, 1000: 0.003}
    assert back.time_at(1000) == 0.003
    assert back.time_at(1100) == 0.003  # nearest measured clock
    assert back.time_at(None) == 0.0025
    assert [ph.name for ph in c.phases[1]] == ["allreduce", "optimizer"]  # file order
    opt = c.phases[1][1]
    assert (opt.time, opt.energy) == (0.010, 2.0)
    assert opt.by_clock == {1400: (0.010, 2.0), 1000: (0.012, None)}
    assert c.phases[1][0].energy is None
    assert 0 not in c.phases


def test_compute_only_profile_has_no_communication() -> None:
    p = parse_profile_csv(csv_of(*COMPUTE))
    assert p.communication == Communication.none()
    assert p.communication.is_none
    for path in ("profiles/gpt3-175b_a100-sxm_8stage.csv", "profiles/gpt3-175b_a40_8stage.csv"):
        shipped = load_profile(path)
        assert shipped.communication.is_none
        # The compute rows alone, written exactly as before.
        assert "transfer" not in shipped.to_csv()


def test_row_order_is_free_and_compute_is_unchanged() -> None:
    a = parse_profile_csv(csv_of(*COMM[::-1], *COMPUTE))
    b = parse_profile_csv(csv_of(*COMPUTE))
    assert a.entries == b.entries
    assert (
        a.communication.transfers
        == parse_profile_csv(csv_of(*COMPUTE, *COMM)).communication.transfers
    )
    # Phase order follows the file: reversed rows reverse it.
    assert [ph.name for ph in a.communication.phases[1]] == ["optimizer", "allreduce"]


def test_csv_and_json_round_trip() -> None:
    p = parse_profile_csv(csv_of(*COMPUTE, *COMM))
    assert parse_profile_csv(p.to_csv()) == p
    assert parse_profile_json(json.dumps(p.to_json())) == p
    assert parse_profile_json(p.to_json()) == p
    assert (
        Communication.from_json(json.loads(json.dumps(p.communication.to_json())))
        == p.communication
    )
    # Empty fields in CSV are nulls in JSON, and a missing key means the same.
    recs = [r for r in p.to_json()["records"] if r["instruction"] == "transfer_forward"]
    assert recs == [
        {
            "stage": 0,
            "instruction": "transfer_forward",
            "frequency": None,
            "time": 0.002,
            "energy": None,
        }
    ]
    obj = p.to_json()
    for r in obj["records"]:
        if r["frequency"] is None:
            del r["frequency"]
    assert parse_profile_json(obj) == p


def test_the_client_reader_skips_communication_rows() -> None:
    data = profile_csv.read_csv(csv_of(*COMPUTE, *COMM))
    assert set(data) == {(0, "forward"), (0, "backward"), (1, "forward"), (1, "backward")}


@pytest.mark.parametrize(
    ("row", "field", "text"),
    [
        ("1,transfer_forward,,0.002,", "stage", "boundaries 0..0"),
        ("2,phase:opt,,0.002,", "stage", "stages 0..1"),
        ("-1,transfer_forward,,0.002,", "stage", "0.."),
        ("x,transfer_forward,,0.002,", "stage", "not a number"),
        ("0,transfer_forward,,0,", "time", "positive"),
        ("0,transfer_forward,,nan,", "time", "finite"),
        ("0,transfer_forward,,,", "time", "missing"),
        ("0,transfer_forward,,0.002,-1", "energy", ">= 0"),
        ("0,transfer_forward,0,0.002,", "frequency", "1.."),
        ("0,transfer_forward,1400.5,0.002,", "frequency", "integer"),
        ("0,transfer_backward,100001,0.002,", "frequency", "MHz"),
        ("0,phase:,,0.002,", "instruction", "phase name"),
        ("0,phase:a b,,0.002,", "instruction", "phase name"),
        ("0,transfer_sideways,1400,0.002,1", "instruction", "unknown instruction"),
        # the same transfer twice, or with and without a clock
        ("0,transfer_forward,,0.003,", "frequency", "duplicate"),
        ("0,transfer_forward,1400,0.003,", "frequency", "with and without a clock"),
        ("1,phase:allreduce,1400,0.003,", "frequency", "with and without a clock"),
    ],
)
def test_bad_rows_name_row_and_field(row: str, field: str, text: str) -> None:
    doc = csv_of(*COMPUTE, *COMM, row)
    with pytest.raises(ProfileError) as e:
        parse_profile_csv(doc)
    assert e.value.row == 16, str(e.value)
    assert e.value.field == field, str(e.value)
    assert text in str(e.value)


def test_bad_json_records_name_index_and_field() -> None:
    recs = parse_profile_csv(csv_of(*COMPUTE)).to_json()["records"]
    bad = [*recs, {"stage": 0, "instruction": "transfer_backward", "time": -1}]
    with pytest.raises(ProfileError) as e:
        parse_profile_json({"records": bad})
    assert (e.value.row, e.value.field) == (len(recs), "time")
    with pytest.raises(ProfileError) as e:
        parse_profile_json(
            {"records": [*recs, {"stage": 0, "instruction": "phase:x", "time": True}]}
        )
    assert (e.value.row, e.value.field) == (len(recs), "time")
    with pytest.raises(ProfileFormatError) as e2:
        Communication.from_json({"records": [{"stage": 0, "instruction": "forward", "time": 1}]})
    assert (e2.value.row, e2.value.field) == (0, "instruction")


def test_with_transfer_replaces_one_time_and_keeps_power() -> None:
    c = parse_profile_csv(csv_of(*COMPUTE, *COMM)).communication
    d = c.with_transfer(0, "backward", 0.004)
    assert d.transfer(0, "backward") == Transfer(0.004, c.transfers[(0, "backward")].power)
    assert d.transfer(0, "forward") == c.transfer(0, "forward")
    assert d.phases == c.phases
    assert c.transfer(0, "backward") != d.transfer(0, "backward")  # c is unchanged
    e = Communication.none().with_transfer(3, "forward", 0.001)
    assert e.transfers == {(3, "forward"): Transfer(0.001)}


def test_dataclasses_validate() -> None:
    with pytest.raises(ProfileFormatError, match="time"):
        Transfer(-1.0)
    with pytest.raises(ProfileFormatError, match="power"):
        Transfer(1.0, power=float("inf"))
    with pytest.raises(ProfileFormatError, match="clock"):
        Transfer(1.0, times_by_clock={0: 1.0})
    with pytest.raises(ProfileFormatError, match="phase name"):
        Phase("", 1.0)
    with pytest.raises(ProfileFormatError, match="direction"):
        Communication({(0, "up"): Transfer(1.0)}, {})
    with pytest.raises(ProfileFormatError, match="twice"):
        Communication({}, {0: [Phase("a", 1.0), Phase("a", 2.0)]})
    with pytest.raises(ProfileError) as e:
        parse_profile_csv(csv_of(*COMPUTE)).with_communication(
            Communication({(1, "forward"): Transfer(1.0)}, {})
        )
    assert e.value.field == "stage"


def test_select_stages_keeps_links_between_stages_that_were_adjacent() -> None:
    stage2 = [r.replace("1,", "2,", 1) for r in COMPUTE[4:]]
    three = parse_profile_csv(
        csv_of(
            *COMPUTE,
            *stage2,
            "0,transfer_forward,,0.002,",
            "1,transfer_forward,,0.005,",
            "2,phase:opt,,0.01,",
        )
    )
    assert three.stages == 3
    first = three.select_stages([1, 2])
    assert first.communication.transfers == {(0, "forward"): Transfer(0.005)}
    assert first.communication.phases == {1: (Phase("opt", 0.01),)}
    gap = three.select_stages([0, 2])
    assert gap.communication.transfers == {}  # stages 0 and 2 had no link between them
    assert three.scaled(time_factor=2.0).communication == three.communication


_value = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
_kind = st.sampled_from(
    ["transfer_forward", "transfer_backward", "phase:opt", "phase:", "phase:a b"]
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.fixed_dictionaries(
            {"instruction": _kind},
            optional={"stage": _value, "frequency": _value, "time": _value, "energy": _value},
        ),
        max_size=6,
    )
)
def test_arbitrary_communication_records_only_raise_profile_errors(recs: list[dict]) -> None:
    base = parse_profile_csv(csv_of(*COMPUTE)).to_json()["records"]
    try:
        p = parse_profile_json({"records": base + recs})
    except ProfileError:
        return
    # What parses round-trips.
    assert parse_profile_csv(p.to_csv()) == p


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.sampled_from(COMM + ["0,transfer_forward,1400,1e-3,", "1,phase:x,,1,-0"]), max_size=8
    )
)
def test_arbitrary_mixes_of_good_rows_parse_or_name_a_row(rows: list[str]) -> None:
    try:
        p = parse_profile_csv(csv_of(*COMPUTE, *rows))
    except ProfileError as e:
        assert e.row is not None and e.field is not None
        return
    assert parse_profile_csv(p.to_csv()) == p
