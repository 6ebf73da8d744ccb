"""Rank and read credentials on a real ``perseus serve``.

Issued once at job creation, only their SHA-256 stored, rotation and revocation take effect at once
and survive a restart, a rank identity is bound to the credential that registered it, the rank
client works with its job's credential, and the command line refuses unusable read-token files.
"""

from __future__ import annotations

import hashlib
import queue
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from perseus_client.transport import ServerLink
from perseus_common.proto import perseus_pb2 as pb
from perseus_common.proto import perseus_pb2_grpc as pb_grpc
from perseus_common.wire.values import RankRegistration
from perseus_server import ServerProcess

from ..conftest import register, solved_job
from ..sqlite_backend import column_values
from .test_gate_scopes import read_token_args

ADMIN = "admin-" + "a" * 26


def exercise_credentials(c: Any, job_id: str) -> None:
    """Every credential route's documented success through ``c``; for the lifecycle test.

    ``c`` is a ``test_openapi.Contract``: each answer is checked against the published schema.
    """
    issued = c.call("POST", "/credentials", 201, json={"scope": "read"}).json()
    assert issued["scope"] == "read" and issued["credential"]
    listed = c.call("GET", "/credentials", 200).json()["credentials"]
    assert issued["id"] in {x["id"] for x in listed}
    c.call("DELETE", "/credentials/{credential_id}", 204, path={"credential_id": issued["id"]})
    c.call("DELETE", "/credentials/{credential_id}", 404, path={"credential_id": issued["id"]})
    rotated = c.call("POST", "/jobs/{job_id}/credentials/rotate", 200, path={"job_id": job_id})
    assert rotated.json()["job_id"] == job_id and rotated.json()["scope"] == "rank"
    c.call("DELETE", "/jobs/{job_id}/credentials", 204, path={"job_id": job_id})
    c.call("DELETE", "/jobs/{job_id}/credentials", 404, path={"job_id": job_id})
    c.call("POST", "/jobs/{job_id}/credentials/rotate", 200, path={"job_id": job_id})


@pytest.fixture()
def srv(tmp_path: Path) -> Iterator[ServerProcess]:
    with ServerProcess(tmp_path / "perseus.db", token=ADMIN) as s:
        yield s


def _md(secret: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {secret}"),)


def _code(fn: Any) -> grpc.StatusCode:
    try:
        fn()
    except grpc.RpcError as e:
        return e.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def _watch_first(stub: pb_grpc.PlanServiceStub, job: str, rank_id: str, secret: str) -> Any:
    return next(
        iter(
            stub.WatchPlan(
                pb.WatchPlanRequest(job_id=job, rank_id=rank_id), metadata=_md(secret), timeout=10
            )
        )
    )


def _report(stub: pb_grpc.PlanServiceStub, job: str, rank_id: str, secret: str, it: int) -> Any:
    rep = pb.IterationReport(
        job_id=job, rank_id=rank_id, iteration=it, iteration_time=1.0, plan_version=1
    )
    return stub.ReportIterations(iter([rep]), metadata=_md(secret), timeout=10)


def _db_bytes(db: Path) -> bytes:
    return b"".join(p.read_bytes() for p in db.parent.glob(db.name + "*"))


def test_rank_credential_lifecycle(srv: ServerProcess, small_csv: str) -> None:
    with httpx.Client(base_url=srv.http_url, headers=srv.headers, timeout=30.0) as http:
        job = solved_job(http, small_csv)
        # The create answer carried it; GET never shows it again.
        assert "rank_credential" not in http.get(f"/jobs/{job}").json()
        other = http.post("/jobs", json={"stages": 2, "microbatches": 2, "blocking_power": 70.0})
        assert other.status_code == 201
        other_job, other_secret = other.json()["id"], other.json()["rank_credential"]
        assert other_secret.startswith("perseus-rank-") and len(other_secret) >= 40
        secret = http.post(f"/jobs/{job}/credentials/rotate").json()["credential"]

        with grpc.insecure_channel(srv.grpc_target) as ch:
            stub = pb_grpc.PlanServiceStub(ch)
            # Its own job: register, watch, report.
            me = register(stub, job, 0, 0, metadata=_md(secret)).rank_id
            assert register(stub, job, 0, 0, metadata=_md(secret)).rank_id == me  # again: same
            assert _watch_first(stub, job, me, secret).version >= 1
            assert _report(stub, job, me, secret, 1).accepted == 1
            # Another job's credential: refused on each method, naming why.
            for fn in (
                lambda: register(stub, job, 0, 0, metadata=_md(other_secret)),
                lambda: register(stub, job, 1, 1, metadata=_md(other_secret)),
                lambda: _watch_first(stub, job, me, other_secret),
                lambda: _report(stub, job, me, other_secret, 2),
                # Its own job named, another job's rank identity: not bound to it.
                lambda: _watch_first(stub, other_job, me, other_secret),
                lambda: _report(stub, other_job, me, other_secret, 2),
            ):
                assert _code(fn) == grpc.StatusCode.PERMISSION_DENIED
            with pytest.raises(grpc.RpcError) as e:
                register(stub, job, 1, 1, metadata=_md(other_secret))
            assert "another job" in str(e.value.details())  # type: ignore[attr-defined]
            # A rank the admin registered: the rank credential must register it first.
            by_admin = register(stub, job, 1, 1, metadata=srv.grpc_metadata).rank_id
            assert _code(lambda: _watch_first(stub, job, by_admin, secret)) == (
                grpc.StatusCode.PERMISSION_DENIED
            )
            assert register(stub, job, 1, 1, metadata=_md(secret)).rank_id == by_admin
            assert _report(stub, job, by_admin, secret, 1).accepted == 1
            # The admin may still act as any rank.
            assert _report(stub, job, me, ADMIN, 3).accepted == 1

            # Rotation: the old secret stops working, the identities stay bound to the new one.
            rotated = http.post(f"/jobs/{job}/credentials/rotate")
            assert rotated.status_code == 200, rotated.text
            new = rotated.json()["credential"]
            assert new != secret and rotated.json()["job_id"] == job
            assert _code(lambda: _report(stub, job, me, secret, 4)) == (
                grpc.StatusCode.UNAUTHENTICATED
            )
            assert _report(stub, job, me, new, 4).accepted == 1
            assert register(stub, job, 0, 0, metadata=_md(new)).rank_id == me

            # Revocation: refused everywhere until rotated again; a second revoke is a 404.
            assert http.delete(f"/jobs/{job}/credentials").status_code == 204
            assert http.delete(f"/jobs/{job}/credentials").status_code == 404
            for fn in (
                lambda: register(stub, job, 0, 0, metadata=_md(new)),
                lambda: _watch_first(stub, job, me, new),
                lambda: _report(stub, job, me, new, 5),
            ):
                assert _code(fn) == grpc.StatusCode.UNAUTHENTICATED
            again = http.post(f"/jobs/{job}/credentials/rotate").json()["credential"]
            assert _report(stub, job, me, again, 5).accepted == 1
            assert http.post("/jobs/nope/credentials/rotate").status_code == 404

        listed = http.get("/credentials").json()["credentials"]
        assert {c["job_id"] for c in listed if c["scope"] == "rank"} == {job, other_job}
        assert all("credential" not in c for c in listed)

    # Only digests are stored: no secret, old or new, is anywhere in the database files.
    raw = _db_bytes(srv.db_path)
    for s in (secret, new, again, other_secret):
        assert s.encode() not in raw
    hashes = column_values(srv.db_path, "credentials", "hash")
    assert hashlib.sha256(again.encode()).hexdigest() in hashes
    assert hashlib.sha256(secret.encode()).hexdigest() not in hashes  # rotated away

    # A restart keeps the credentials, their revocations and the bindings.
    srv.stop()
    srv.start()
    with grpc.insecure_channel(srv.grpc_target) as ch:
        stub = pb_grpc.PlanServiceStub(ch)
        assert _report(stub, job, me, again, 6).accepted == 1
        assert _code(lambda: _report(stub, job, me, new, 6)) == grpc.StatusCode.UNAUTHENTICATED
        assert _code(lambda: _watch_first(stub, job, me, other_secret)) == (
            grpc.StatusCode.PERMISSION_DENIED
        )
    with httpx.Client(base_url=srv.http_url, headers=srv.headers, timeout=30.0) as http:
        # Deleting the job deletes its credentials.
        assert http.delete(f"/jobs/{other_job}").status_code == 204
        assert other_job not in {
            c.get("job_id") for c in http.get("/credentials").json()["credentials"]
        }
        r = httpx.get(srv.http_url + "/jobs", headers={"Authorization": f"Bearer {other_secret}"})
        assert r.status_code == 401


def test_issued_read_credential(srv: ServerProcess) -> None:
    with httpx.Client(base_url=srv.http_url, headers=srv.headers, timeout=30.0) as http:
        r = http.post("/credentials", json={"scope": "read"})
        assert r.status_code == 201, r.text
        cred = r.json()
        assert cred["scope"] == "read" and cred["credential"].startswith("perseus-read-")
        assert http.post("/credentials", json={"scope": "admin"}).status_code == 422
        ro = {"Authorization": f"Bearer {cred['credential']}"}
        assert httpx.get(srv.http_url + "/jobs", headers=ro).status_code == 200
        assert httpx.get(srv.http_url + "/credentials", headers=ro).status_code == 200
        r = httpx.post(
            srv.http_url + "/jobs",
            headers=ro,
            json={"stages": 2, "microbatches": 2, "blocking_power": 70.0},
        )
        assert r.status_code == 403 and r.json()["scope"] == "admin"
        r = httpx.post(srv.http_url + "/credentials", headers=ro, json={"scope": "read"})
        assert r.status_code == 403  # a read credential cannot mint credentials
        srv.stop()
        srv.start()
    with httpx.Client(base_url=srv.http_url, headers=srv.headers, timeout=30.0) as http:
        assert httpx.get(srv.http_url + "/jobs", headers=ro).status_code == 200
        assert http.delete(f"/credentials/{cred['id']}").status_code == 204
        assert http.delete(f"/credentials/{cred['id']}").status_code == 404
        assert httpx.get(srv.http_url + "/jobs", headers=ro).status_code == 401
        (row,) = [
            c for c in http.get("/credentials").json()["credentials"] if c["id"] == cred["id"]
        ]
        assert row["revoked"] is not None


def test_rank_client_with_its_jobs_credential(srv: ServerProcess, small_csv: str) -> None:
    with httpx.Client(base_url=srv.http_url, headers=srv.headers, timeout=30.0) as http:
        job = solved_job(http, small_csv)
        secret = http.post(f"/jobs/{job}/credentials/rotate").json()["credential"]
    plans: list[Any] = []
    ident = RankRegistration(job, 0, 0, 0, 0, "NVIDIA A40", (), "test")
    link = ServerLink(srv.grpc_target, ident, plans.append, token=secret, report_interval=0.05)
    link.start()
    try:
        assert link.wait_registered(20)
        deadline = time.monotonic() + 20
        while not plans and time.monotonic() < deadline:
            time.sleep(0.05)
        assert plans and plans[0].version >= 1
    finally:
        link.close()


def test_open_server_issues_no_rank_credential(http: httpx.Client) -> None:
    r = http.post("/jobs", json={"stages": 2, "microbatches": 2, "blocking_power": 70.0})
    assert r.status_code == 201 and "rank_credential" not in r.json()


def _serve(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "perseus_server", "--http-port", "0", "--grpc-port", "0"]
    cmd += ["--db", str(tmp / "x.db"), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def test_read_token_file_must_be_usable(tmp_path: Path) -> None:
    admin = tmp_path / "admin"
    admin.write_text("admin-token\n")
    admin.chmod(0o600)
    # Without an admin token.
    r = _serve(tmp_path, *read_token_args(tmp_path))
    assert r.returncode == 2 and "--read-token-file needs --token-file" in r.stderr
    # The admin token again.
    r = _serve(tmp_path, "--token-file", str(admin), *read_token_args(tmp_path, "admin-token"))
    assert r.returncode == 2 and "another token" in r.stderr
    # Readable by others.
    args = read_token_args(tmp_path)
    Path(args[1]).chmod(0o644)
    r = _serve(tmp_path, "--token-file", str(admin), *args)
    assert r.returncode == 2 and "--read-token-file" in r.stderr and "chmod 600" in r.stderr


def test_rotation_and_revocation_end_streams_already_open(
    srv: ServerProcess, small_csv: str
) -> None:
    with httpx.Client(base_url=srv.http_url, headers=srv.headers, timeout=30.0) as http:
        job = solved_job(http, small_csv)
        secret = http.post(f"/jobs/{job}/credentials/rotate").json()["credential"]
        with grpc.insecure_channel(srv.grpc_target) as ch:
            stub = pb_grpc.PlanServiceStub(ch)
            me = register(stub, job, 0, 0, metadata=_md(secret)).rank_id
            sends: queue.Queue[Any] = queue.Queue()

            def reports() -> Iterator[Any]:
                while (rep := sends.get()) is not None:
                    yield rep

            def rep(it: int) -> Any:
                return pb.IterationReport(
                    job_id=job, rank_id=me, iteration=it, iteration_time=1.0, plan_version=1,
                    sequence=it,
                )  # fmt: skip

            def last_iteration() -> Any:
                return http.get(f"/jobs/{job}/status").json()["ranks"][0]["last_iteration"]

            ack = stub.ReportIterations.future(reports(), metadata=_md(secret), timeout=30)
            watch = stub.WatchPlan(
                pb.WatchPlanRequest(job_id=job, rank_id=me), metadata=_md(secret), timeout=30
            )
            assert next(watch).version >= 1
            sends.put(rep(1))
            deadline = time.monotonic() + 10
            while last_iteration() != 1:
                assert time.monotonic() < deadline, "the first report was not stored"
                time.sleep(0.05)
            new = http.post(f"/jobs/{job}/credentials/rotate").json()["credential"]
            # The open report stream: its next report is refused, not stored.
            sends.put(rep(2))
            with pytest.raises(grpc.RpcError) as err:
                ack.result(timeout=10)
            assert err.value.code() is grpc.StatusCode.UNAUTHENTICATED
            assert last_iteration() == 1
            # The open watch stream: ends before it pushes the next plan.
            assert http.put(f"/jobs/{job}/plan", json={"slowdown": 0.15}).status_code == 200
            with pytest.raises(grpc.RpcError) as err:
                next(watch)
            assert err.value.code() is grpc.StatusCode.UNAUTHENTICATED
            # The new secret works on a fresh stream; revoking ends its open streams too.
            watch = stub.WatchPlan(
                pb.WatchPlanRequest(job_id=job, rank_id=me), metadata=_md(new), timeout=30
            )
            assert next(watch).version >= 2
            assert _report(stub, job, me, new, 3).accepted == 1
            assert http.delete(f"/jobs/{job}/credentials").status_code == 204
            assert http.put(f"/jobs/{job}/plan", json={"slowdown": 0.0}).status_code == 200
            with pytest.raises(grpc.RpcError) as err:
                next(watch)
            assert err.value.code() is grpc.StatusCode.UNAUTHENTICATED
