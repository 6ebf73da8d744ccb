"""``domain/errors.py``: the client errors the service raises, as RFC 9457 problem documents.

REST renders them (``tests/server/rest/test_problems.py``), gRPC maps their status to codes; here,
what each carries: its status and title, a detail bounded in length, the field at fault, and the
``Retry-After`` of an unavailable server.
"""

from __future__ import annotations

import pytest

from perseus_server.domain.errors import (
    MAX_DETAIL,
    ApiError,
    BadRequest,
    Conflict,
    NotFound,
    StoreUnavailable,
    TooLarge,
    Unauthorized,
    Unavailable,
)


@pytest.mark.parametrize(
    ("error", "status"),
    [(BadRequest, 422), (NotFound, 404), (Conflict, 409), (TooLarge, 413), (Unauthorized, 401)],
)
def test_each_error_is_its_status_in_a_problem_document(error: type[ApiError], status: int) -> None:
    err = error("job 'x' is unknown", field="job_id", limit=5)
    assert str(err) == "job 'x' is unknown" and err.headers() == {}
    assert err.problem() == {
        "type": "about:blank",
        "title": error.title,
        "status": status,
        "detail": "job 'x' is unknown",
        "field": "job_id",
        "limit": 5,
    }


def test_a_problem_without_a_field_names_none() -> None:
    assert "field" not in BadRequest("the body is empty").problem()


def test_a_long_detail_is_cut_to_its_bound() -> None:
    quoted = "x" * 100_000  # a hostile value quoted back
    err = BadRequest(f"stages: {quoted!r} is not a stage list")
    assert len(err.detail) == MAX_DETAIL and err.detail.endswith("\u2026")
    assert str(err) == err.detail and err.problem()["detail"] == err.detail
    exact = "y" * MAX_DETAIL
    assert BadRequest(exact).detail == exact  # at the bound: kept whole


def test_an_unavailable_server_says_when_to_retry() -> None:
    err = Unavailable("the leader is elsewhere", retry_after=3)
    assert (err.status, err.retry_after, err.headers()) == (503, 3, {"Retry-After": "3"})
    assert err.problem()["retry_after"] == 3


def test_a_full_disk_is_an_unavailable_store_of_its_kind() -> None:
    err = StoreUnavailable("the disk is full", kind="disk_full", retry_after=30)
    assert isinstance(err, Unavailable) and err.kind == "disk_full"
    assert err.headers() == {"Retry-After": "30"}
    problem = err.problem()
    assert (problem["status"], problem["kind"], problem["retry_after"]) == (503, "disk_full", 30)
