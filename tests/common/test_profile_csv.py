"""``perseus_common.profile_csv``: the one profile reader, its bounds and its refusals.

Every refusal is a :class:`ProfileFormatError` naming the row and the field where there is one;
what the core and the client each make of the same rows is ``test_vocabulary.py``'s.
"""

from __future__ import annotations

from typing import Any

import pytest

from perseus_common import profile_csv
from perseus_common.profile_csv import (
    MAX_FIELD_CHARS,
    ProfileFormatError,
    as_int,
    as_nonnegative_float,
    as_positive_float,
    check_complete,
    csv_rows,
    load_json,
    read_csv,
)

HEADER = "stage,instruction,frequency,time,energy\n"


def test_options_are_grouped_by_stage_and_kind_highest_clock_first() -> None:
    text = HEADER + "0,forward,1000,0.2,2\n\n0,forward,1410,0.1,3\n1,backward,1410,0.3,6\n"
    assert read_csv(text) == {
        (0, "forward"): [(1410, 0.1, 3.0), (1000, 0.2, 2.0)],
        (1, "backward"): [(1410, 0.3, 6.0)],
    }
    assert list(read_csv(text, stages=[1])) == [(1, "backward")]


def test_columns_may_come_in_any_order_with_others_beside_them() -> None:
    text = "energy,note,time,frequency,instruction,stage\n3,hi,0.1,1410,forward,0\n"
    assert [row for _, row in csv_rows(text)] == [
        {"stage": "0", "instruction": "forward", "frequency": "1410", "time": "0.1", "energy": "3"}
    ]


@pytest.mark.parametrize(
    ("text", "match", "row", "field"),
    [
        ("", "the profile is empty", None, None),
        ("stage,instruction,time,energy\n", "missing frequency", 1, None),
        (HEADER + "0,forward,1410,0.1\n", "expected 5 fields, found 4", 2, None),
        (
            HEADER + "0,forward,1410,0.1," + "9" * (MAX_FIELD_CHARS + 1) + "\n",
            "at most",
            2,
            "energy",
        ),
        (HEADER, "no measurement rows", None, None),
    ],
)
def test_a_malformed_document_is_refused_at_its_place(
    text: str, match: str, row: int | None, field: str | None
) -> None:
    with pytest.raises(ProfileFormatError, match=match) as info:
        read_csv(text)
    assert (info.value.row, info.value.field) == (row, field)


def test_stages_asked_that_are_not_there_are_named() -> None:
    with pytest.raises(ProfileFormatError, match=r"no rows for stage\(s\) \[7\]"):
        read_csv(HEADER + "0,forward,1410,0.1,3\n", stages=[7])


def test_a_complete_profile_numbers_its_stages_and_has_both_passes() -> None:
    whole = read_csv(HEADER + "0,forward,1410,0.1,3\n0,backward,1410,0.2,6\n")
    check_complete(whole)
    split = read_csv(
        HEADER + "0,forward,1410,0.1,3\n0,backward_input,1410,0.1,3\n0,backward_weight,1410,0.1,3\n"
    )
    check_complete(split)  # both halves count as a backward
    with pytest.raises(ProfileFormatError, match=r"stage\(s\) \[0\] missing"):
        check_complete(read_csv(HEADER + "1,forward,1410,0.1,3\n1,backward,1410,0.2,6\n"))
    with pytest.raises(ProfileFormatError, match="stage 0 has no backward"):
        check_complete(read_csv(HEADER + "0,forward,1410,0.1,3\n"))


def test_json_is_bounded_in_depth_and_integer_length() -> None:
    assert load_json(b'{"a": [1, {"b": "[[[["}]}') == {"a": [1, {"b": "[[[["}]}
    with pytest.raises(ProfileFormatError, match="nested deeper than 8"):
        load_json("[" * 9 + "]" * 9)
    assert load_json("[" * 8 + "]" * 8) == [[[[[[[[]]]]]]]]
    with pytest.raises(ProfileFormatError, match="integer literal of 33 digits"):
        load_json("1" * 33)
    with pytest.raises(ProfileFormatError, match="not valid JSON"):
        load_json("{")
    with pytest.raises(ProfileFormatError, match="not UTF-8"):
        load_json(b"\xff")


@pytest.mark.parametrize(
    ("convert", "value", "expected"),
    [
        (as_int, "12", 12),
        (as_int, 3.0, 3),
        (as_int, 2.5, "must be an integer"),
        (as_int, True, "not a number"),
        (as_int, "x", "not a number"),
        (as_positive_float, "0.5", 0.5),
        (as_positive_float, 0, "must be positive"),
        (as_positive_float, "inf", "must be finite"),
        (as_nonnegative_float, 0, 0.0),
        (as_nonnegative_float, -1, "must be >= 0"),
        (as_nonnegative_float, "n" * (MAX_FIELD_CHARS + 1), "at most"),
    ],
)
def test_a_value_is_converted_or_refused_naming_its_field(
    convert: Any, value: Any, expected: Any
) -> None:
    if isinstance(expected, str):
        with pytest.raises(ProfileFormatError, match=expected) as info:
            convert(value, "time", 4)
        assert (info.value.field, info.value.row) == ("time", 4)
    else:
        assert convert(value, "time", 4) == expected


def test_transfers_and_phases_are_communication_rows() -> None:
    assert profile_csv.is_communication_instruction("transfer_forward")
    assert profile_csv.is_communication_instruction("phase:optimizer")
    assert not profile_csv.is_communication_instruction("forward")
