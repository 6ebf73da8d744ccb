"""``GET /jobs/{id}/plan`` is answered from bytes built once per (job, query).

The cached answer is byte for byte the one built afresh (and what the model's path would send), a
new profile, a new solve and the job's deletion each give a fresh answer, and the cache is bounded
per job and in all (:class:`perseus_server.service.plans.PlanAnswers`).
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any, cast

import httpx

from perseus_server.models.responses import PlanDoc
from perseus_server.service.plans import PlanAnswers
from perseus_server.service.state import Job

from ..conftest import solved_job, wait_frontier


def _scaled(csv_text: str, time: float, energy: float) -> str:
    """``csv_text`` with every time and energy scaled."""
    head, *rows = csv_text.splitlines()
    out = [head]
    for row in rows:
        s, i, f, t, e = row.split(",")
        out.append(f"{s},{i},{f},{float(t) * time!r},{float(e) * energy!r}")
    return "\n".join(out) + "\n"


def _headers(r: httpx.Response) -> list[tuple[bytes, bytes]]:
    return [(k, v) for k, v in r.headers.raw if k.lower() != b"date"]


def _plan(http: httpx.Client, job: str, **params: Any) -> httpx.Response:
    r = http.get(f"/jobs/{job}/plan", params=params)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/json"
    return r


def test_a_cached_answer_is_the_one_built_afresh(http: httpx.Client, small_csv: str) -> None:
    job = solved_job(http, small_csv)
    for query in (
        {"slowdown": 0.05},
        {"deadline": 1e9, "steps": True},
        {"eta": 0.5, "max_power": 300},
    ):
        first, again = _plan(http, job, **query), _plan(http, job, **query)
        assert again.content == first.content  # the second from PlanAnswerFront
        assert _headers(again) == _headers(first)
        # another query for the same point is built afresh: the same bytes
        index = first.json()["index"]
        fresh = _plan(http, job, index=index, steps=query.get("steps", False))
        assert fresh.content == first.content
        doc = json.loads(first.content)
        model = json.loads(PlanDoc.model_validate(doc).model_dump_json(exclude_unset=True))
        assert list(model) == list(doc) and model == doc


def test_a_new_profile_a_new_solve_and_deletion_give_fresh_answers(
    http: httpx.Client, small_csv: str
) -> None:
    job = solved_job(http, small_csv)
    cached = _plan(http, job, slowdown=0.05).json()
    assert _plan(http, job, slowdown=0.05).json() == cached
    # A new profile (more energy at the same clocks): the peak powers change, same frontier.
    r = http.put(
        f"/jobs/{job}/profile",
        content=_scaled(small_csv, 1.0, 1.5),
        headers={"content-type": "text/csv"},
    )
    assert r.status_code == 200, r.text
    after_profile = _plan(http, job, slowdown=0.05).json()
    assert after_profile["peak_power"] != cached["peak_power"]
    assert after_profile["time"] == cached["time"]
    # A new solve over a slower profile: a new frontier, new times.
    r = http.put(
        f"/jobs/{job}/profile",
        content=_scaled(small_csv, 1.25, 1.5),
        headers={"content-type": "text/csv"},
    )
    assert r.status_code == 200, r.text
    assert http.post(f"/jobs/{job}/frontier").status_code == 202
    assert wait_frontier(http, job)["status"] == "done"
    after_solve = _plan(http, job, slowdown=0.05).json()
    assert after_solve["max_frequency_time"] > cached["max_frequency_time"] * 1.2
    # The job deleted: the cached answer is gone with it.
    assert http.delete(f"/jobs/{job}").status_code == 204
    r = http.get(f"/jobs/{job}/plan", params={"slowdown": 0.05})
    assert r.status_code == 404 and r.json()["field"] == "job_id", r.text


def test_the_query_is_checked_before_the_job_is_looked_up(http: httpx.Client) -> None:
    r = http.get(f"/jobs/{'0' * 16}/plan", params={"slowdown": 0.05, "deadline": 1.0})
    assert r.status_code == 422, r.text  # as before: the query is checked first
    r = http.get(f"/jobs/{'0' * 16}/plan", params={"slowdown": 0.05})
    assert r.status_code == 404, r.text


def _job(job_id: str) -> Job:
    frontier = SimpleNamespace(current=object(), row=SimpleNamespace(partial=False))
    return cast(
        Job, SimpleNamespace(id=job_id, frontier=frontier, profile=SimpleNamespace(current=None))
    )


def test_the_cache_is_bounded_per_job_and_in_all() -> None:
    answers = PlanAnswers(per_job=4, total=10)
    a, b, c = _job("a"), _job("b"), _job("c")
    for i in range(100):  # a caller varying the query
        answers.put(a, ("slowdown", i), b"%d" % i)
    assert len(answers) == 4
    assert answers.get(a, ("slowdown", 99)) == b"99" and answers.get(a, ("slowdown", 95)) is None
    for job in (b, c):
        for i in range(4):
            answers.put(job, i, b"x")
    assert len(answers) == 10  # the least recently used job's oldest answers went first
    assert answers.get(c, 0) == b"x" and answers.get(b, 3) == b"x"
    assert answers.get(a, ("slowdown", 96)) is None and answers.get(a, ("slowdown", 99)) == b"99"
    # A new frontier (or profile, or partial flag) drops the job's answers.
    a.frontier.current = object()
    assert answers.get(a, ("slowdown", 99)) is None and len(answers) == 8
    answers.forget("b")
    assert answers.get(b, 3) is None and len(answers) == 4


def test_the_cache_is_bounded_in_bytes() -> None:
    answers = PlanAnswers(per_job=100, total=100, total_bytes=1000)
    a, b = _job("a"), _job("b")
    answers.put(a, "huge", b"x" * 1001)  # larger than the bound: not kept
    assert answers.get(a, "huge") is None and answers.bytes == 0
    for i in range(3):
        answers.put(a, i, b"x" * 300)
    answers.put(a, 0, b"y" * 300)  # replaced, not counted twice
    assert (len(answers), answers.bytes) == (3, 900)
    answers.put(b, 0, b"z" * 500)  # a's least recently used two go
    assert (len(answers), answers.bytes) == (2, 800)
    assert answers.get(a, 2) is None and answers.get(a, 0) == b"y" * 300
