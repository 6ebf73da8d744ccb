"""Bearer-token auth and TLS for both REST and gRPC (one server with both on)."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest

from perseus_common.proto import perseus_pb2 as pb
from perseus_common.proto import perseus_pb2_grpc as pb_grpc
from perseus_server import ServerProcess

TOKEN = "t0k-" + "x" * 28

pytestmark = pytest.mark.skipif(
    shutil.which("openssl") is None, reason="needs the openssl command to make a certificate"
)


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=IP:127.0.0.1,DNS:localhost",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    with ServerProcess(d / "perseus.db", token=TOKEN, tls_cert=cert, tls_key=key) as srv:
        yield srv


def _cert(srv: ServerProcess) -> Path:
    assert srv.tls_cert is not None
    return srv.tls_cert


def test_rest_needs_the_token(secure: ServerProcess) -> None:
    assert secure.http_url.startswith("https://")
    with httpx.Client(
        base_url=secure.http_url,
        verify=ssl.create_default_context(cafile=str(_cert(secure))),
        timeout=10,
    ) as c:
        assert c.get("/healthz").status_code == 200  # the one open route
        assert c.get("/openapi.json").status_code == 200  # the schema (and /docs) hold no data
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
            for method, path in (
                ("GET", "/jobs"),
                ("POST", "/jobs"),
                ("GET", "/metrics"),
            ):
                r = c.request(method, path, headers=headers, json={"stages": 2, "microbatches": 2})
                assert r.status_code == 401, (method, path, headers)
                assert (
                    r.json()["field"] == "Authorization"
                    and r.headers["www-authenticate"] == "Bearer"
                )
        r = c.post(
            "/jobs",
            headers=secure.headers,
            json={"blocking_power": 70.0, "stages": 2, "microbatches": 2},
        )
        assert r.status_code == 201
        assert len(c.get("/jobs", headers=secure.headers).json()["jobs"]) == 1


def test_plain_http_is_refused_on_the_tls_port(secure: ServerProcess) -> None:
    with pytest.raises(httpx.HTTPError):
        httpx.get(secure.http_url.replace("https://", "http://") + "/healthz", timeout=5)


def test_grpc_needs_the_token_over_tls(secure: ServerProcess) -> None:
    creds = grpc.ssl_channel_credentials(root_certificates=_cert(secure).read_bytes())
    with grpc.secure_channel(secure.grpc_target, creds) as channel:
        stub = pb_grpc.PlanServiceStub(channel)
        req = pb.RegisterRankRequest(job_id="nope", global_rank=0)
        for md in ((), (("authorization", "Bearer wrong"),)):
            with pytest.raises(grpc.RpcError) as e:
                stub.RegisterRank(req, metadata=md, timeout=10)
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED  # type: ignore[attr-defined]
            with pytest.raises(grpc.RpcError) as e:
                next(
                    stub.WatchPlan(
                        pb.WatchPlanRequest(job_id="nope", rank_id="r"), metadata=md, timeout=10
                    )
                )
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED  # type: ignore[attr-defined]
            with pytest.raises(grpc.RpcError) as e:
                stub.ReportIterations(
                    iter([pb.IterationReport(job_id="nope")]), metadata=md, timeout=10
                )
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED  # type: ignore[attr-defined]
        with pytest.raises(grpc.RpcError) as e:
            stub.RegisterRank(req, metadata=secure.grpc_metadata, timeout=10)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND  # type: ignore[attr-defined]
    with grpc.insecure_channel(secure.grpc_target) as channel, pytest.raises(grpc.RpcError):
        pb_grpc.PlanServiceStub(channel).RegisterRank(req, metadata=secure.grpc_metadata, timeout=3)
