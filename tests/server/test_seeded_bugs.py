"""Tests that catch the bugs seeding showed the suite missed: a route that skips the token check
(every route of the router and every gRPC method, not a hand-made list), detection settings
without hysteresis, and the stage detector's pace-change rule (unit and end to end)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest

from perseus_common.proto import perseus_pb2 as pb
from perseus_common.proto import perseus_pb2_grpc as pb_grpc
from perseus_server import ServerProcess
from perseus_server.decisions.detectors import DetectorSettings, StageDetector
from perseus_server.domain.states import DetectorEvent

from .conftest import problem_field, solved_job
from .routes import app_routes
from .test_slow_stage_stragglers import _Ranks, _status, _wait

TOKEN = "the-right-token"
PUBLIC = {"/healthz"}


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with ServerProcess(tmp_path_factory.mktemp("db") / "perseus.db", token=TOKEN) as srv:
        yield srv


def test_every_route_needs_the_token(tmp_path: Path, secure: ServerProcess, small_csv: str) -> None:
    with httpx.Client(base_url=secure.http_url, headers=secure.headers, timeout=30.0) as http:
        job_id = solved_job(http, small_csv)
    routes = app_routes(tmp_path)
    assert len(routes) >= 20
    checked = 0
    with httpx.Client(base_url=secure.http_url, timeout=30.0) as anon:
        for route in routes:
            if route.path in PUBLIC:
                continue
            for method in sorted(route.methods):
                path = route.path.replace("{job_id}", job_id)
                for headers in (
                    {},
                    {"Authorization": "Bearer wrong-token"},
                    {"Authorization": f"Basic {TOKEN}"},
                    {"Authorization": f"Bearer {TOKEN}x"},
                ):
                    r = anon.request(method, path, headers=headers, json={})
                    assert r.status_code == 401, f"{method} {route.path} {headers}: {r.text}"
                    assert problem_field(r) == "Authorization"
                    checked += 1
        assert anon.get("/healthz").status_code == 200
        # The job is untouched by all of that.
        r = anon.get(f"/jobs/{job_id}", headers=secure.headers)
        assert r.status_code == 200 and r.json()["state"] == "ready"
    assert checked >= 4 * 20


def test_every_grpc_method_needs_the_token(secure: ServerProcess) -> None:
    service = pb.DESCRIPTOR.services_by_name["PlanService"]
    assert len(service.methods) >= 3
    with grpc.insecure_channel(secure.grpc_target) as ch:
        for method in service.methods:
            path = f"/{service.full_name}/{method.name}"
            req_cls = getattr(pb, method.input_type.name)
            for metadata in ((), (("authorization", "Bearer wrong"),)):
                if method.client_streaming:
                    call = ch.stream_unary(path, req_cls.SerializeToString, lambda b: b)
                    args: object = iter([req_cls()])
                elif method.server_streaming:
                    call = ch.unary_stream(path, req_cls.SerializeToString, lambda b: b)
                    args = req_cls()
                else:
                    call = ch.unary_unary(path, req_cls.SerializeToString, lambda b: b)
                    args = req_cls()
                with pytest.raises(grpc.RpcError) as e:
                    result = call(args, metadata=metadata, timeout=10)
                    if method.server_streaming:
                        next(iter(result))  # type: ignore[call-overload]
                assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED, (path, metadata)


@pytest.mark.parametrize(
    ("threshold", "recovery"), [(0.05, 0.05), (0.1, 0.1), (0.05, 0.2), (1.0, 1.0)]
)
def test_detection_without_hysteresis_is_refused(
    secure: ServerProcess, small_csv: str, threshold: float, recovery: float
) -> None:
    with httpx.Client(base_url=secure.http_url, headers=secure.headers, timeout=30.0) as http:
        job_id = http.get("/jobs").json()["jobs"][0]["id"]
        before = http.get(f"/jobs/{job_id}/status").json()["straggler_detection"]
        r = http.put(
            f"/jobs/{job_id}/straggler-detection",
            json={"threshold": threshold, "consecutive": 3, "recovery": recovery},
        )
        assert r.status_code == 422 and problem_field(r) == "recovery"
        assert http.get(f"/jobs/{job_id}/status").json()["straggler_detection"] == before
        just_below = {"threshold": threshold, "consecutive": 3, "recovery": threshold * 0.99}
        r = http.put(f"/jobs/{job_id}/straggler-detection", json=just_below)
        assert r.status_code == 200, r.text


# --- the stage detector's pace-change rule ---------------------------------------------------


def _feed(det: StageDetector, factors: list[float], current: float | None) -> list[object]:
    return [det.observe(0, 1, f, current)[0] for f in factors]


def test_stage_pace_change_rule() -> None:
    s = DetectorSettings(threshold=0.1, consecutive=3, recovery=0.02)
    # Slow by 1.5: three slow iterations flag it.
    det = StageDetector(s)
    assert _feed(det, [1.5, 1.5, 1.5], None) == [None, None, DetectorEvent.SLOW]
    # Known slow by 1.5, now 2.0 for three iterations: a changed pace, with the new mean.
    det = StageDetector(s)
    events = [det.observe(0, 1, f, 1.5) for f in (2.0, 2.0, 2.0)]
    assert events[-1] == (DetectorEvent.CHANGED, pytest.approx(2.0))
    # Within the threshold of the known factor: no change (1.6 / 1.5 - 1 < 0.1).
    det = StageDetector(s)
    assert _feed(det, [1.6, 1.6, 1.6, 1.6], 1.5) == [None] * 4
    # One iteration of the window back at the known pace: not every one is off, no change.
    det = StageDetector(s)
    assert _feed(det, [2.0, 1.5, 2.0], 1.5) == [None] * 3
    # Faster but still slow (1.5 -> 1.2): changed too, in either direction.
    det = StageDetector(s)
    assert _feed(det, [1.2, 1.2, 1.2], 1.5)[-1] is DetectorEvent.CHANGED
    # Back within recovery of the profile: recovered, not changed.
    det = StageDetector(s)
    assert _feed(det, [1.01, 1.0, 1.02], 1.5)[-1] is DetectorEvent.RECOVERED
    # Between recovery and threshold: neither slow (a change) nor recovered.
    det = StageDetector(s)
    assert _feed(det, [1.05, 1.05, 1.05], 1.5) == [None] * 3


def test_a_slow_stage_whose_pace_changes_is_resolved_again(
    http: httpx.Client, stub: pb_grpc.PlanServiceStub, small_csv: str
) -> None:
    job = solved_job(http, small_csv, data_parallel=2)
    assert (
        http.put(
            f"/jobs/{job}/straggler-detection",
            json={"threshold": 0.05, "consecutive": 3, "recovery": 0.02},
        ).status_code
        == 200
    )
    ranks = _Ranks(stub, job, small_csv)
    version = _status(http, job)["plan"]["version"]
    ranks.report({(1, 1): 1.3}, version, n=3)
    st = _wait(
        http,
        job,
        lambda s: (
            (s["pipelines"][1]["slow_stages"] or {}).get("status") == "ready"
            and s["plan"]["version"] > version
        ),
    )
    first = st["pipelines"][1]["slow_stages"]
    assert first["factors"] == {"1": pytest.approx(1.3)}
    t_first = st["plan"]["pipelines"][1]["time"]
    # The stage gets slower still: a new pace, a new re-solve with the new factor.
    version = st["plan"]["version"]
    ranks.report({(1, 1): 1.8}, version, n=3)
    st = _wait(
        http,
        job,
        lambda s: (
            (s["pipelines"][1]["slow_stages"] or {}).get("factors", {}).get("1", 0) > 1.5
            and s["pipelines"][1]["slow_stages"]["status"] == "ready"
            and s["plan"]["version"] > version
        ),
    )
    assert st["pipelines"][1]["slow_stages"]["factors"] == {"1": pytest.approx(1.8)}
    assert st["plan"]["pipelines"][1]["time"] > t_first
    assert "perseus_stage_resolve_seconds_count 2" in http.get("/metrics").text
