"""``rest/problems.py``: every client error of the app as an ``application/problem+json`` body.

A small FastAPI app with the handlers installed, through its real ASGI stack: the service's own
errors, request validation (each invalid input named by its field, not by pydantic's location),
malformed JSON, an unknown path and a method the route does not take.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import BaseModel, Field

from perseus_server.domain.errors import NotFound, Unavailable
from perseus_server.rest.problems import PROBLEM, install_error_handlers


class _Budget(BaseModel):
    watts: float = Field(gt=0)
    jobs: list[str]


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/jobs/{job_id}")
    async def job(job_id: str) -> None:
        raise NotFound(f"no job {job_id!r}", field="job_id")

    @app.get("/busy")
    async def busy() -> None:
        raise Unavailable("the leader is elsewhere", retry_after=7)

    @app.put("/budget")
    async def budget(body: _Budget) -> _Budget:
        return body

    with TestClient(app, base_url="http://localhost") as c:
        yield c


def test_a_service_error_is_its_problem_document(client: TestClient) -> None:
    r = client.get("/jobs/abc")
    assert r.status_code == 404 and r.headers["content-type"] == PROBLEM
    assert r.json() == {
        "type": "about:blank",
        "title": "Not found",
        "status": 404,
        "detail": "no job 'abc'",
        "field": "job_id",
    }


def test_an_unavailable_answer_carries_retry_after(client: TestClient) -> None:
    r = client.get("/busy")
    assert (r.status_code, r.headers["retry-after"]) == (503, "7")
    assert r.json()["retry_after"] == 7


def test_validation_names_each_field_and_counts_the_rest(client: TestClient) -> None:
    r = client.put("/budget", json={"watts": -1, "jobs": 3})
    assert r.status_code == 422 and r.headers["content-type"] == PROBLEM
    body = r.json()
    assert (body["title"], body["field"]) == ("Invalid request", "watts")
    assert body["detail"].startswith("watts: ") and body["detail"].endswith("(and 1 more)")
    assert [e["field"] for e in body["errors"]] == ["watts", "jobs"]


def test_malformed_json_is_the_bodys_fault(client: TestClient) -> None:
    r = client.put("/budget", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["field"] == "body"


def test_an_unknown_path_and_a_wrong_method_are_problems_too(client: TestClient) -> None:
    r = client.get("/nowhere")
    assert r.status_code == 404 and r.headers["content-type"] == PROBLEM
    assert (r.json()["title"], r.json()["field"]) == ("Not found", "path")
    r = client.delete("/busy")
    assert r.status_code == 405 and r.json()["title"] == "Method not allowed"
    assert r.headers["allow"] == "GET"  # the handler keeps the exception's headers
