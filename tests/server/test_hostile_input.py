"""Hostile input against a real ``perseus serve``.

Every malformed input is a 4xx problem body naming the field, never a 5xx, and nothing an input asks
for is sized by a number inside it.

The route walk takes the routes from the application itself (not a hand-made list), so a new
route is covered the day it is added.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from perseus_common.proto import perseus_pb2 as pb
from perseus_common.proto import perseus_pb2_grpc as pb_grpc
from perseus_server import ServerProcess
from perseus_server.config import Limits
from perseus_server.rest import create_app
from perseus_server.runtime.sql_store import SqlStore
from perseus_server.service import PerseusService

from .conftest import make_job, problem_field, register, solved_job
from .routes import app_routes

HEADER = "stage,instruction,frequency,time,energy\n"


def assert_client_error(r: httpx.Response, what: str) -> None:
    assert r.status_code < 500, f"{what}: {r.status_code} {r.text[:300]}"
    if r.status_code >= 400:
        assert r.headers["content-type"].startswith("application/problem+json"), (
            f"{what}: {r.text[:200]}"
        )


def internal_errors(http: httpx.Client) -> float:
    text = http.get("/metrics").text
    m = re.search(r"^perseus_internal_errors_total(?:\{\})? (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


@pytest.fixture(scope="module")
def solved(http: httpx.Client, small_csv: str) -> str:
    return solved_job(http, small_csv, data_parallel=2)


# --- profiles --------------------------------------------------------------------------------


def _profile_cases(csv_text: str) -> Iterator[tuple[str, str, str, str]]:
    """(name, content type, body, expected field prefix)."""
    nested = "[" * 200_000 + "]" * 200_000
    yield "nested list", "application/json", nested, "profile"
    yield "nested records", "application/json", '{"records":' + nested + "}", "profile"
    yield "long int", "application/json", '[{"stage": ' + "9" * 5000 + "}]", "profile"
    rec = '{"stage":0,"instruction":"forward","frequency":%s,"time":1,"energy":1}'
    yield "json freq i32", "application/json", "[" + rec % (2**31) + "]", "profile.frequency"
    yield "json freq 1e400", "application/json", "[" + rec % "1e400" + "]", "profile.frequency"
    yield "json stage list", "application/json", '[{"stage":[1]}]', "profile"
    long_field = HEADER + '0,forward,1000,"' + "1" * 200_000 + '",1\n'
    yield "over-long csv field", "text/csv", long_field, "profile"
    yield "long field", "text/csv", HEADER + "0,forward,1000," + "1" * 100 + ",1\n", "profile.time"
    yield "stray CR", "text/csv", HEADER + "0,forward,1000,1\r0,1\n", "profile"
    yield "NUL", "text/csv", HEADER + "0,forward,1000,\x00,1\n", "profile"
    yield "stage far away", "text/csv", csv_text + "1000000000,forward,1740,1,1\n", "profile.stage"
    yield "stage beyond i32", "text/csv", csv_text + f"{2**40},forward,1740,1,1\n", "profile.stage"
    for freq in (2**31, 99_999_999_999, 100_001, -1):
        body = csv_text.replace(",1740,", f",{freq},")
        yield f"frequency {freq}", "text/csv", body, "profile.frequency"
    yield "frequency 1e400", "text/csv", csv_text.replace(",1740,", ",1e400,"), "profile.frequency"
    yield "time 1e400", "text/csv", HEADER + "0,forward,1000,1e400,1\n", "profile.time"


def test_bad_profiles_are_422_naming_the_field(http: httpx.Client, small_csv: str) -> None:
    job_id = make_job(http)
    for name, ctype, body, field in _profile_cases(small_csv):
        r = http.put(f"/jobs/{job_id}/profile", content=body, headers={"content-type": ctype})
        assert r.status_code == 422, f"{name}: {r.status_code} {r.text[:300]}"
        got = problem_field(r)
        assert got is not None and got.startswith(field), f"{name}: field {got!r}: {r.text[:300]}"
    # The stored profile is untouched (none yet), and a good one is still accepted.
    assert http.get(f"/jobs/{job_id}/profile").status_code == 404
    r = http.put(f"/jobs/{job_id}/profile", content=small_csv, headers={"content-type": "text/csv"})
    assert r.status_code == 200, r.text
    assert max(r.json()["frequencies"]) < 2**31


# --- jobs and plans --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("orders", "message"),
    [
        ([[["forward", 0, 100_000_000]], [["backward", 0, 0]]], "model stage"),
        ([[["forward", 100_000_000, 0]], [["backward", 0, 0]]], "microbatch"),
        ([[["forward", 10**30, 0]], [["backward", 0, 0]]], "less than or equal"),
        ([[["f" * 100, 0, 0]], [["backward", 0, 0]]], "at most 64"),
        ([[["forward", 0, 0]]] * 3, "ranks"),
    ],
)
def test_custom_orders_are_bounded_by_the_job(
    http: httpx.Client, orders: list[Any], message: str
) -> None:
    body = {"stages": 2, "microbatches": 4, "schedule": {"name": "custom", "orders": orders}}
    r = http.post("/jobs", json=body)
    assert r.status_code == 422, r.text
    assert (problem_field(r) or "").startswith("schedule.orders")
    assert message in r.json()["detail"]


def test_numbers_beyond_their_range(http: httpx.Client, solved: str) -> None:
    huge = 10**30
    cases = [
        ("GET", f"/jobs/{solved}/plan", {"params": {"index": huge}}, "index"),
        ("GET", f"/jobs/{solved}/plan", {"params": {"index": 2**63}}, "index"),
        ("GET", f"/jobs/{solved}/plan", {"params": {"deadline": "1e400"}}, "deadline"),
        ("PUT", f"/jobs/{solved}/plan", {"json": {"index": huge}}, "index"),
        ("PUT", f"/jobs/{solved}/plan", {"json": {"pipelines": [huge]}}, "pipelines.0"),
        ("POST", f"/jobs/{solved}/stragglers", {"json": {"pipeline": huge}}, "pipeline"),
        ("DELETE", f"/jobs/{solved}/stragglers", {"params": {"pipeline": huge}}, "pipeline"),
        ("POST", f"/jobs/{solved}/profiling", {"json": {"frequencies": [2**40]}}, "frequencies.0"),
        (
            "POST",
            f"/jobs/{solved}/profiling",
            {"json": {"frequencies": [3_000_000_000]}},
            "frequencies.0",
        ),
    ]
    for method, path, kw, field in cases:
        r = http.request(method, path, **kw)
        assert r.status_code == 422, f"{method} {path} {kw}: {r.status_code} {r.text[:300]}"
        assert problem_field(r) == field, r.text
    # A frontier index beyond the frontier is a 422 too.
    r = http.get(f"/jobs/{solved}/plan", params={"index": 2**31 - 1})
    assert r.status_code == 422, r.text


def test_nested_json_bodies_are_4xx(http: httpx.Client) -> None:
    for body in ("[" * 1_000_000 + "]" * 1_000_000, '{"stages":' + "[" * 100_000 + "]" * 100_000):
        r = http.post("/jobs", content=body, headers={"content-type": "application/json"})
        assert 400 <= r.status_code < 500, r.text[:300]
        assert problem_field(r) == "body"


# --- gRPC ------------------------------------------------------------------------------------


def test_grpc_numbers_beyond_their_range(
    http: httpx.Client, stub: pb_grpc.PlanServiceStub, solved: str
) -> None:
    with pytest.raises(grpc.RpcError) as e:
        register(stub, solved, 0, 0, clocks=[2**31 - 1])
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details().startswith("supported_clocks_mhz")
    rank = register(stub, solved, 0, 0).rank_id
    report = pb.IterationReport(
        job_id=solved,
        rank_id=rank,
        iteration=1,
        iteration_time=1.0,
        plan_version=1,
        instructions=[
            pb.InstructionMeasurement(
                instruction="forward", microbatch=0, frequency_mhz=2**31 - 1, time=0.1, stage=0
            )
        ],
    )
    with pytest.raises(grpc.RpcError) as e:
        stub.ReportIterations(iter([report]), timeout=10)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "frequency" in e.value.details()


# --- the router walk -------------------------------------------------------------------------

_BODIES: list[tuple[str, bytes, str]] = [
    ("invalid json", b"{not json", "application/json"),
    ("nested json", b"[" * 100_000 + b"]" * 100_000, "application/json"),
    ("long int", b'{"index": ' + b"9" * 5000 + b"}", "application/json"),
    ("wrong type", b"[1, 2, 3]", "application/json"),
    ("nan", b'{"index": NaN, "threshold": NaN, "pipeline": NaN}', "application/json"),
    ("huge numbers", b'{"index": 1e400, "pipeline": 1e400, "stages": 1e400}', "application/json"),
    ("binary", bytes(range(256)) * 4, "application/octet-stream"),
    ("not utf-8 csv", b"\xff\xfe" * 100, "text/csv"),
]
_QUERY_VALUES = ["", "nan", "inf", "-1", "1e400", str(10**30), "x" * 5000, "\x00"]


def test_every_route_refuses_malformed_input(
    tmp_path: Path, server: ServerProcess, http: httpx.Client, solved: str
) -> None:
    before = internal_errors(http)
    routes = app_routes(tmp_path)
    assert len(routes) >= 20
    calls = 0
    for route in routes:
        query = [p.alias for p in route.dependant.query_params]
        for method in sorted(route.methods):
            for job_id in (solved, "no-such-job", "x" * 5000, "%00"):
                if method == "DELETE" and route.path == "/jobs/{job_id}" and job_id == solved:
                    continue  # deleting the shared job would end the walk
                path = route.path.replace("{job_id}", job_id)
                what = f"{method} {route.path} (job {job_id[:12]})"
                if method in ("POST", "PUT"):
                    for name, body, ctype in _BODIES:
                        r = http.request(
                            method, path, content=body, headers={"content-type": ctype}
                        )
                        assert_client_error(r, f"{what} {name}")
                        calls += 1
                for q in query:
                    for v in _QUERY_VALUES:
                        r = http.request(method, path, params={q: v})
                        assert_client_error(r, f"{what} ?{q}={v[:20]!r}")
                        calls += 1
                if not query and method not in ("POST", "PUT"):
                    assert_client_error(http.request(method, path), what)
                    calls += 1
    assert calls > 200
    assert internal_errors(http) == before
    assert "Exception in ASGI application" not in server.output()
    assert http.get("/healthz").status_code == 200


def test_an_unexpected_exception_is_a_500_problem(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    store = SqlStore.open(tmp_path / "bug.db")
    try:
        service = PerseusService(store, Limits())
        app = create_app(service)

        @app.get("/bug")
        async def bug() -> None:
            raise RuntimeError("a seeded bug")

        with TestClient(app, raise_server_exceptions=False, base_url="http://localhost") as client:
            r = client.get("/bug")
        assert r.status_code == 500
        assert r.headers["content-type"].startswith("application/problem+json")
        assert r.json()["status"] == 500 and "seeded" not in r.text
        assert "perseus_internal_errors_total 1" in service.metrics.render()
    finally:
        store.close()


def test_large_profiles_are_parsed_in_a_worker_process(http: httpx.Client, small_csv: str) -> None:
    """Documents over the process threshold go to the parse worker: same answers."""
    from perseus_server.runtime.parse_pool import PROCESS_THRESHOLD

    job_id = make_job(http)
    rec = '{"stage":0,"instruction":"forward","frequency":1740,"time":0.1,"energy":1}'
    body = '{"records":[' + ",".join([rec] * (PROCESS_THRESHOLD // len(rec) + 10)) + "]}"
    assert len(body) > PROCESS_THRESHOLD
    r = http.put(
        f"/jobs/{job_id}/profile", content=body, headers={"content-type": "application/json"}
    )
    assert r.status_code == 422, r.text[:300]
    assert problem_field(r) == "profile.frequency" and r.json()["row"] == 1  # the duplicate
    nested = "[" * (PROCESS_THRESHOLD + 1) + "]" * (PROCESS_THRESHOLD + 1)
    r = http.put(
        f"/jobs/{job_id}/profile", content=nested, headers={"content-type": "application/json"}
    )
    assert r.status_code == 422 and "nested" in r.json()["detail"]
    padded = small_csv + "\n" * (PROCESS_THRESHOLD + 1)  # blank lines: a valid, large document
    r = http.put(f"/jobs/{job_id}/profile", content=padded, headers={"content-type": "text/csv"})
    assert r.status_code == 200, r.text[:300]
    assert r.json()["rows"] == len(small_csv.strip().splitlines()) - 1
