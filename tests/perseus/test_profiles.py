"""Profiles: CSV/JSON round trips, validation errors, and the choice of options worth running.

Every validation error names its row and field; the options worth running are Pareto on effective
cost, on the lower convex hull.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from perseus.errors import ProfileError
from perseus.profiles import (
    InstructionProfile,
    Profile,
    load_profile,
    lower_hull_indices,
    pareto_indices,
    parse_profile_csv,
    parse_profile_json,
)
from perseus.schedules import one_f_one_b
from perseus.solver import solve_frontier

HEADER = "stage,instruction,frequency,time,energy\n"
# A valid 2-stage profile, 2 frequencies; CSV line numbers (header = 1) in the comments.
GOOD_ROWS = [
    "0,forward,1400,0.010,3.0",  # 2
    "0,forward,1000,0.014,2.5",  # 3
    "0,backward,1400,0.020,6.0",  # 4
    "0,backward,1000,0.028,5.0",  # 5
    "1,forward,1400,0.011,3.3",  # 6
    "1,forward,1000,0.015,2.8",  # 7
    "1,backward,1400,0.022,6.6",  # 8
    "1,backward,1000,0.030,5.5",  # 9
]


def csv_with(rows: list[str]) -> str:
    return HEADER + "\n".join(rows) + "\n"


def replaced(line: int, row: str) -> str:
    """The good CSV with CSV line ``line`` (header = 1) replaced by ``row``."""
    rows = list(GOOD_ROWS)
    rows[line - 2] = row
    return csv_with(rows)


def test_good_profile_parses_sorted_by_decreasing_frequency() -> None:
    rows = GOOD_ROWS[::-1]  # any row order
    p = parse_profile_csv(csv_with(rows))
    assert p.stages == 2
    assert p.kinds == ("forward", "backward")
    assert p.frequencies == [1400, 1000]
    fwd = p[(0, "forward")]
    assert fwd.frequencies.tolist() == [1400, 1000]
    assert fwd.times.tolist() == [0.010, 0.014]
    assert fwd.energies.tolist() == [3.0, 2.5]
    assert fwd.max_frequency == 1400
    with pytest.raises(ProfileError, match="stage 2"):
        p[(2, "forward")]


def test_columns_may_come_in_any_order_and_blank_lines_are_skipped() -> None:
    text = "energy,time,frequency,instruction,stage\n" + "\n".join(
        ",".join(reversed(r.split(","))) + ("\n" if i % 2 else "\n\n")
        for i, r in enumerate(GOOD_ROWS)
    )
    assert parse_profile_csv(text) == parse_profile_csv(csv_with(GOOD_ROWS))


def test_csv_round_trip_of_the_real_profile_is_exact(a100: Profile) -> None:
    text = a100.to_csv()
    assert text.splitlines()[0] == HEADER.strip()
    back = parse_profile_csv(text)
    assert back == a100
    assert back.to_csv() == text
    assert back.stages == 8 and len(back.frequencies) == 38


def test_json_round_trip_of_the_real_profile_is_exact(a100: Profile) -> None:
    doc = a100.to_json()
    assert doc["format"] == "perseus-profile/1"
    assert len(doc["records"]) == 8 * 2 * 38
    assert set(doc["records"][0]) == {"stage", "instruction", "frequency", "time", "energy"}
    text = json.dumps(doc)
    assert parse_profile_json(text) == a100
    assert parse_profile_json(json.loads(text)) == a100
    assert parse_profile_json(doc["records"]) == a100  # a bare list of records


def test_load_profile_reads_both_file_types(tmp_path: Path, a100: Profile) -> None:
    (tmp_path / "p.csv").write_text(a100.to_csv())
    (tmp_path / "p.json").write_text(json.dumps(a100.to_json()))
    assert load_profile(tmp_path / "p.csv") == a100
    assert load_profile(tmp_path / "p.json") == a100
    with pytest.raises(ProfileError, match="cannot read"):
        load_profile(tmp_path / "missing.csv")


def test_profiles_differing_in_one_value_are_not_equal() -> None:
    a = parse_profile_csv(csv_with(GOOD_ROWS))
    b = parse_profile_csv(replaced(9, "1,backward,1000,0.030,5.50001"))
    assert a != b


def test_scaled_multiplies_one_stage() -> None:
    p = parse_profile_csv(csv_with(GOOD_ROWS))
    q = p.scaled(1, time_factor=2.0)
    assert q[(0, "forward")] == p[(0, "forward")]
    np.testing.assert_allclose(q[(1, "backward")].times, p[(1, "backward")].times * 2)
    np.testing.assert_allclose(q[(1, "backward")].energies, p[(1, "backward")].energies * 2)
    r = p.scaled(time_factor=1.5, energy_factor=1.0)
    np.testing.assert_allclose(r[(0, "forward")].times, p[(0, "forward")].times * 1.5)
    np.testing.assert_array_equal(r[(0, "forward")].energies, p[(0, "forward")].energies)
    with pytest.raises(ProfileError, match="time_factor"):
        p.scaled(0, time_factor=0.0)


# --- validation: every error names the row and/or field ------------------------------------


@pytest.mark.parametrize(
    ("line", "row", "field", "words"),
    [
        (3, "0,forward,1000,nan,2.5", "time", "finite"),
        (4, "0,backward,1400,0.020,NaN", "energy", "finite"),
        (5, "0,backward,1000,inf,5.0", "time", "finite"),
        (6, "1,forward,1400,0.011,-inf", "energy", "finite"),
        (7, "1,forward,1000,-0.015,2.8", "time", "positive"),
        (8, "1,backward,1400,0.022,-6.6", "energy", "positive"),
        (9, "1,backward,1000,0,5.5", "time", "positive"),
        (2, "0,forward,1400,0.010,0.0", "energy", "positive"),
        (3, "0,forward,fast,0.014,2.5", "frequency", "not a number"),
        (4, "zero,backward,1400,0.020,6.0", "stage", "not a number"),
        (5, "0,backward,1000,0.028s,5.0", "time", "not a number"),
        (6, "1,forward,1400,0.011,", "energy", "missing"),
        (7, "1,forward,1000.5,0.015,2.8", "frequency", "integer"),
        (8, "1,sideways,1400,0.022,6.6", "instruction", "unknown instruction"),
        (9, "-1,backward,1000,0.030,5.5", "stage", ">= 0"),
        (2, "0,forward,0,0.010,3.0", "frequency", "positive"),
    ],
)
def test_bad_value_names_row_and_field(line: int, row: str, field: str, words: str) -> None:
    with pytest.raises(ProfileError, match=words) as info:
        parse_profile_csv(replaced(line, row))
    err = info.value
    assert err.row == line and err.field == field
    assert f"row {line}" in str(err) and f"field {field!r}" in str(err)


def test_duplicate_measurement_names_both_rows() -> None:
    rows = [*GOOD_ROWS[:5], "0,forward,1000,0.015,2.6", *GOOD_ROWS[5:]]  # duplicate of line 3
    with pytest.raises(ProfileError, match="duplicate") as info:
        parse_profile_csv(csv_with(rows))
    assert info.value.row == 7 and info.value.field == "frequency"
    assert "row 7" in str(info.value) and "first on row 3" in str(info.value)
    assert "stage 0" in str(info.value) and "1000 MHz" in str(info.value)


@pytest.mark.parametrize(("drop", "missing"), [("backward", "backward"), ("forward", "forward")])
def test_stage_with_only_one_direction(drop: str, missing: str) -> None:
    rows = [r for r in GOOD_ROWS if not r.startswith(f"1,{drop},")]
    with pytest.raises(ProfileError, match=f"stage 1 has no {missing}") as info:
        parse_profile_csv(csv_with(rows))
    assert info.value.field == "instruction"


def test_stages_must_be_numbered_from_zero_without_gaps() -> None:
    gap = GOOD_ROWS + [r.replace("1,", "3,", 1) for r in GOOD_ROWS[4:]]
    with pytest.raises(ProfileError, match=r"0\.\.S-1.*\[2\]") as info:
        parse_profile_csv(csv_with(gap))
    assert info.value.field == "stage"
    shifted = [r.replace("0,", "2,", 1) if r.startswith("0,") else r for r in GOOD_ROWS]
    with pytest.raises(ProfileError, match=r"\[0\]") as info:
        parse_profile_csv(csv_with(shifted))
    assert info.value.field == "stage"


@pytest.mark.parametrize("text", ["", "   \n\n", HEADER, HEADER + "\n,,,,\n"])
def test_empty_profile(text: str) -> None:
    with pytest.raises(ProfileError, match="empty"):
        parse_profile_csv(text)


def test_header_missing_a_column() -> None:
    text = "stage,instruction,frequency,time\n" + "\n".join(r.rsplit(",", 1)[0] for r in GOOD_ROWS)
    with pytest.raises(ProfileError, match="missing energy") as info:
        parse_profile_csv(text)
    assert info.value.row == 1


@pytest.mark.parametrize("row", ["0,backward,1400,0.020", "0,backward,1400,0.020,6.0,7"])
def test_wrong_field_count(row: str) -> None:
    with pytest.raises(ProfileError, match="expected 5 fields") as info:
        parse_profile_csv(replaced(4, row))
    assert info.value.row == 4 and "row 4" in str(info.value)


def json_records() -> list[dict[str, object]]:
    return [
        dict(
            zip(("stage", "instruction", "frequency", "time", "energy"), r.split(","), strict=True)
        )
        for r in GOOD_ROWS
    ]


def test_json_numbers_may_be_strings_or_numbers() -> None:
    recs = json_records()
    recs[0] = {"stage": 0, "instruction": "forward", "frequency": 1400, "time": 0.01, "energy": 3}
    assert parse_profile_json({"records": recs}) == parse_profile_csv(csv_with(GOOD_ROWS))


@pytest.mark.parametrize(
    ("index", "key", "value", "words"),
    [
        (3, "time", math.nan, "finite"),
        (5, "energy", -1.0, "positive"),
        (0, "frequency", "high", "not a number"),
        (6, "time", True, "not a number"),
        (2, "energy", None, "missing"),
        (7, "instruction", "recompute", "unknown instruction"),
    ],
)
def test_json_errors_name_the_record_index(index: int, key: str, value: object, words: str) -> None:
    recs = json_records()
    recs[index][key] = value
    with pytest.raises(ProfileError, match=words) as info:
        parse_profile_json(json.dumps({"records": recs}))
    assert info.value.row == index and info.value.field == key


@pytest.mark.parametrize(
    ("doc", "words"),
    [
        ("{not json", "not valid JSON"),
        ({"rows": []}, "records"),
        ({"records": []}, "empty"),
        ({"records": [1, 2]}, "object"),
        (42, "records"),
    ],
)
def test_malformed_json_documents(doc: object, words: str) -> None:
    with pytest.raises(ProfileError, match=words):
        parse_profile_json(doc)


def test_json_record_without_a_key() -> None:
    recs = json_records()
    del recs[4]["frequency"]
    with pytest.raises(ProfileError, match="missing") as info:
        parse_profile_json({"records": recs})
    assert info.value.row == 4 and info.value.field == "frequency"


# --- options worth running ---------------------------------------------------------------


def test_pareto_indices_hand_made() -> None:
    times = np.array([3.0, 1.0, 2.0, 2.0, 4.0, 5.0])
    costs = np.array([5.0, 10.0, 7.0, 6.0, 5.0, 1.0])
    # by time: (1,10) kept; (2,6) kept, (2,7) same time dearer; (3,5) kept; (4,5) not cheaper
    # than (3,5); (5,1) kept
    assert pareto_indices(times, costs).tolist() == [1, 3, 0, 5]
    # equal points: one survives
    assert pareto_indices(np.array([1.0, 1.0]), np.array([2.0, 2.0])).tolist() == [0]
    # a slower, dearer option is dropped
    assert pareto_indices(np.array([1.0, 2.0]), np.array([1.0, 1.5])).tolist() == [0]


def test_lower_hull_indices_hand_made() -> None:
    t = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    c = np.array([10.0, 6.0, 5.0, 2.0, 1.0])
    # (3,5) lies above the segment (2,6)-(4,2) (which passes 4 at t=3): not a hull vertex
    assert lower_hull_indices(t, c).tolist() == [0, 1, 3, 4]
    # collinear middle points are not vertices
    assert lower_hull_indices(t[:3], np.array([3.0, 2.0, 1.0])).tolist() == [0, 2]
    # a point just below the chord stays
    assert lower_hull_indices(t[:3], np.array([3.0, 1.99, 1.0])).tolist() == [0, 1, 2]
    assert lower_hull_indices(t[:1], c[:1]).tolist() == [0]
    assert lower_hull_indices(t[:2], c[:2]).tolist() == [0, 1]


def two_option_profile() -> Profile:
    """Every instruction: 1400 MHz takes 1 s for 100 J; 1000 MHz takes 2 s for 150 J.

    Slower *and* more energy: useless on its own, but at blocking power P its effective cost is
    150 - 2P against 100 - P, i.e. the slow option wins whenever P > 50 W (waiting 1 s at P costs
    more than the extra 50 J).
    """
    fwd = InstructionProfile(np.array([1400, 1000]), np.array([1.0, 2.0]), np.array([100.0, 150.0]))
    return Profile({(0, "forward"): fwd, (0, "backward"): fwd})


def test_effective_cost_keeps_a_slow_option_that_beats_idling() -> None:
    ip = two_option_profile()[(0, "forward")]
    np.testing.assert_allclose(ip.effective_costs(60.0), [40.0, 30.0])
    assert ip.pareto(0.0).tolist() == [0]
    assert ip.pareto(40.0).tolist() == [0]
    assert ip.pareto(60.0).tolist() == [0, 1]


def test_effective_cost_changes_the_frontier_plans() -> None:
    profile = two_option_profile()
    sched = one_f_one_b(1, 1)
    low = solve_frontier(profile, sched, 0.0)
    assert len(low) == 1
    assert set(low.frequencies(0).tolist()) == {1400}
    high = solve_frontier(profile, sched, 60.0)
    used = {int(f) for i in range(len(high)) for f in high.frequencies(i)}
    assert used == {1400, 1000}
    # the slowest plan runs both instructions at 1000 MHz: 4 s, 300 J, which beats the fastest
    # plan (2 s, 200 J) plus 2 s of waiting at 60 W (320 J)
    assert high.times[-1] == pytest.approx(4.0)
    assert high.energies[-1] == pytest.approx(300.0)
    assert high.energy_at(4.0) == pytest.approx(300.0)


def test_select_stages_keeps_and_renumbers_the_chosen_stages() -> None:
    from perseus.profiles import load_profile

    full = load_profile(
        Path(__file__).resolve().parents[2] / "profiles" / "gpt3-175b_a100-sxm_8stage.csv"
    )
    first = full.select_stages(range(4))
    assert first.stages == 4 and first.kinds == full.kinds
    assert first[(3, "forward")] == full[(3, "forward")]
    picked = full.select_stages([6, 1])
    assert picked.stages == 2
    assert picked[(0, "backward")] == full[(6, "backward")]
    assert picked[(1, "backward")] == full[(1, "backward")]
    for bad, match in (([], "at least one"), ([8], "not in the profile"), ([1, 1], "twice")):
        with pytest.raises(ProfileError, match=match) as err:
            full.select_stages(bad)
        assert err.value.field == "stages"


@pytest.mark.parametrize(
    ("text", "stages"),
    [("0-3", [0, 1, 2, 3]), ("0,2,4", [0, 2, 4]), ("4-5, 0", [4, 5, 0]), ("7", [7])],
)
def test_parse_stage_list(text: str, stages: list[int]) -> None:
    from perseus.profiles import parse_stage_list

    assert parse_stage_list(text) == stages


@pytest.mark.parametrize("text", ["", "a", "3-1", "-2", "0-", "1,,2", "0-999999999"])
def test_parse_stage_list_refuses_what_is_not_a_list_of_stages(text: str) -> None:
    from perseus.profiles import parse_stage_list

    with pytest.raises(ProfileError) as err:
        parse_stage_list(text)
    assert err.value.field == "stages"


def test_json_profiles_are_parsed_with_bounded_depth() -> None:
    deep = '{"records": ' + "[" * 5000 + "]" * 5000 + "}"
    with pytest.raises(ProfileError):
        parse_profile_json(deep)
