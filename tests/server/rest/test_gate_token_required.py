"""With a token configured, every route but ``/healthz`` and every gRPC method needs it.

With a token configured, every REST route but ``/healthz`` and every gRPC method refuse a call
without it, with a wrong one or in another scheme (401 / UNAUTHENTICATED): the routes come from the
application's router and the methods from the service descriptor, not a hand-made list, so a route
that skips the check fails here the day it is added.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest

from perseus_common.proto import perseus_pb2 as pb
from perseus_server import ServerProcess

from ..conftest import problem_field, solved_job
from ..routes import app_routes

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
