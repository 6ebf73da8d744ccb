"""``rest/monitoring.py``: the server's liveness (``/healthz``) and its Prometheus metrics.

The REST app over a service on a real SQLite file, through its ASGI stack: liveness needs no
token and counts the jobs; the metrics need one, and are what Prometheus's parser reads.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ..conftest import in_process_app

TOKEN = "monitoring-admin-token"


@pytest.fixture(scope="module")
def http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    with in_process_app(
        tmp_path_factory.mktemp("monitoring") / "perseus.db", token=TOKEN
    ) as client:
        yield client


def test_liveness_needs_no_token_and_counts_the_jobs(http: httpx.Client) -> None:
    open_ = http.get("/healthz", headers={"Authorization": ""})  # the token dropped
    assert open_.status_code == 200
    body = open_.json()
    assert set(body) == {"status", "jobs", "uptime_seconds", "kernels"} and body["status"] == "ok"
    assert (
        http.post(
            "/jobs", json={"stages": 2, "microbatches": 4, "blocking_power": 70.0}
        ).status_code
        == 201
    )
    assert http.get("/healthz").json()["jobs"] == body["jobs"] + 1


def test_the_metrics_need_a_token(http: httpx.Client) -> None:
    assert http.get("/metrics", headers={"Authorization": ""}).status_code == 401
    r = http.get("/metrics")
    names = {f.name for f in text_string_to_metric_families(r.text)}
    assert r.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert {"perseus_requests", "perseus_request_latency_seconds"} <= names


def test_healthz_and_metrics(http: httpx.Client) -> None:
    r = http.get("/healthz")
    assert r.status_code == 200 and r.json()["status"] == "ok"
    m = http.get("/metrics")
    assert m.status_code == 200 and m.headers["content-type"].startswith("text/plain")
    assert "# TYPE perseus_request_latency_seconds histogram" in m.text
    assert 'perseus_requests_total{method="GET",route="/healthz",status="200"}' in m.text
