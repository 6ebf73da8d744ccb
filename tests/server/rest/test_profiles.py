"""``rest/profiles.py``: a job's profile uploaded, selected by stage and downloaded.

The REST app over a service on a real SQLite file, through its ASGI stack (no solve, no rank:
no server process needed): CSV and JSON round trips, a stage selection renumbered from 0, and a
bad profile refused naming its row's field while the stored one stays.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from ..conftest import in_process_app, make_job, problem_field, sliced_profile_csv


@pytest.fixture(scope="module")
def http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    with in_process_app(tmp_path_factory.mktemp("profiles") / "perseus.db") as client:
        yield client


def test_a_stage_selection_is_renumbered_from_zero(http: httpx.Client) -> None:
    four = sliced_profile_csv(stages=4)
    job_id = make_job(http)  # two stages
    csv = {"content-type": "text/csv"}
    r = http.put(f"/jobs/{job_id}/profile", params={"stages": "1,3"}, content=four, headers=csv)
    assert r.status_code == 200, r.text
    assert r.json()["stages"] == 2
    rows = http.get(f"/jobs/{job_id}/profile", params={"format": "json"}).json()["records"]
    want = [line.split(",") for line in four.splitlines()[1:] if line.startswith("3,")]
    got = [r for r in rows if r["stage"] == 1]
    assert [(r["instruction"], r["frequency"]) for r in got] == [(w[1], int(w[2])) for w in want]


@pytest.mark.parametrize(
    ("stages", "field"), [("0-2", "stages"), ("x", "stages"), ("0,7", "stages")]
)
def test_a_bad_stage_selection_names_stages(http: httpx.Client, stages: str, field: str) -> None:
    job_id = make_job(http)
    r = http.put(
        f"/jobs/{job_id}/profile",
        params={"stages": stages},
        content=sliced_profile_csv(stages=4),
        headers={"content-type": "text/csv"},
    )
    assert r.status_code == 422 and problem_field(r) == field, r.text
    assert http.get(f"/jobs/{job_id}/profile").status_code == 404  # nothing stored


def test_profile_upload_and_download(http: httpx.Client, small_csv: str) -> None:
    job_id = make_job(http)
    r = http.get(f"/jobs/{job_id}/profile")
    assert r.status_code == 404 and problem_field(r) == "profile"
    r = http.put(f"/jobs/{job_id}/profile", content=small_csv, headers={"content-type": "text/csv"})
    assert r.status_code == 200, r.text
    info = r.json()
    assert (
        info["revision"] == 1
        and info["stages"] == 2
        and info["rows"] == 24
        and len(info["frequencies"]) == 6
    )
    csv_back = http.get(f"/jobs/{job_id}/profile")
    assert csv_back.headers["content-type"].startswith("text/csv")
    assert csv_back.text.splitlines()[0] == "stage,instruction,frequency,time,energy"
    as_json = http.get(f"/jobs/{job_id}/profile", params={"format": "json"}).json()
    assert len(as_json["records"]) == 24
    r = http.put(f"/jobs/{job_id}/profile", json=as_json)
    assert r.status_code == 200 and r.json()["revision"] == 2
    assert http.get(f"/jobs/{job_id}/profile").text == csv_back.text
    assert http.get(f"/jobs/{job_id}").json()["state"] == "profiled"


def _bad_profiles(csv_text: str) -> list[tuple[str, str]]:
    lines = csv_text.splitlines()
    head, rows = lines[0], lines[1:]

    def with_row(i: int, col: int, value: str) -> str:
        cells = rows[i].split(",")
        cells[col] = value
        return "\n".join([head, *rows[:i], ",".join(cells), *rows[i + 1 :]]) + "\n"

    three_stages = (
        "\n".join([head, *rows, *(r.replace("1,", "2,", 1) for r in rows if r.startswith("1,"))])
        + "\n"
    )
    no_backward = "\n".join([head, *(r for r in rows if not r.startswith("1,backward"))]) + "\n"
    return [
        (with_row(0, 3, "nan"), "profile.time"),
        (with_row(0, 3, "-0.1"), "profile.time"),
        (with_row(0, 4, "0"), "profile.energy"),
        (with_row(1, 1, "sideways"), "profile.instruction"),
        ("\n".join([head, *rows, rows[0]]) + "\n", "profile.frequency"),
        (three_stages, "profile.stages"),
        (no_backward, "profile.instruction"),
        ("stage,instruction\n0,forward\n", "profile"),
        ("", "profile"),
    ]


def test_bad_profiles_keep_the_stored_one(http: httpx.Client, small_csv: str) -> None:
    job_id = make_job(http)
    assert (
        http.put(
            f"/jobs/{job_id}/profile", content=small_csv, headers={"content-type": "text/csv"}
        ).status_code
        == 200
    )
    stored = http.get(f"/jobs/{job_id}/profile").text
    for text, field in _bad_profiles(small_csv):
        r = http.put(f"/jobs/{job_id}/profile", content=text, headers={"content-type": "text/csv"})
        assert r.status_code == 422, (field, r.text)
        assert problem_field(r) == field, (field, r.json())
    r = http.put(
        f"/jobs/{job_id}/profile", content=b"\xff\xfe\x00bad", headers={"content-type": "text/csv"}
    )
    assert r.status_code == 422 and problem_field(r) == "profile"
    r = http.put(f"/jobs/{job_id}/profile", json={"records": [{"stage": 0}]})
    assert r.status_code == 422 and problem_field(r).startswith("profile.")
    assert http.get(f"/jobs/{job_id}/profile").text == stored
    assert http.get(f"/jobs/{job_id}").json()["profile"]["revision"] == 1
    r = http.put("/jobs/nope/profile", content=small_csv, headers={"content-type": "text/csv"})
    assert r.status_code == 404 and problem_field(r) == "job_id"
