"""``testing/process.py``: ``perseus serve`` as a real subprocess on free ports.

Started, it has printed its addresses and answers ``/healthz``; its token travels in the headers
and gRPC metadata it hands out; a server that cannot start is an error carrying its output.
"""

from __future__ import annotations

from pathlib import Path

import grpc
import httpx
import pytest

from perseus_common.proto import perseus_pb2 as pb
from perseus_common.proto import perseus_pb2_grpc as pb_grpc
from perseus_server.testing.process import ServerProcess

TOKEN = "process-test-token-0123456789"


def test_a_started_server_answers_with_the_token_it_was_given(tmp_path: Path) -> None:
    srv = ServerProcess(tmp_path / "perseus.db", token=TOKEN)
    with pytest.raises(RuntimeError, match="not started"):
        _ = srv.pid
    with srv:
        assert srv.returncode is None and srv.pid > 0
        assert srv.http_url.startswith("http://127.0.0.1:") and srv.http_url[-1] != "0"
        assert srv.headers == {"Authorization": f"Bearer {TOKEN}"}
        assert httpx.get(srv.http_url + "/jobs", headers=srv.headers).status_code == 200
        assert httpx.get(srv.http_url + "/jobs").status_code == 401
        with grpc.insecure_channel(srv.grpc_target) as channel:
            stub = pb_grpc.PlanServiceStub(channel)
            with pytest.raises(grpc.RpcError) as e:  # the token is good: the job is unknown
                stub.RegisterRank(
                    pb.RegisterRankRequest(job_id="nope"), metadata=srv.grpc_metadata, timeout=10
                )
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        with pytest.raises(RuntimeError, match="already running"):
            srv.start()
        assert "perseus: REST listening on " + srv.http_url in srv.output()
    assert srv.returncode == 0  # SIGTERM: a clean exit
    assert srv.stop() == 0  # stopped already: nothing to do


def test_a_server_that_cannot_start_is_an_error_with_its_output(tmp_path: Path) -> None:
    srv = ServerProcess(tmp_path / "perseus.db", extra_args=["--no-such-option"])
    with pytest.raises(RuntimeError, match=r"exited with status 2(.|\n)*--no-such-option"):
        srv.start()
    srv.close()
