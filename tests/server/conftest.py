"""Fixtures: a real ``perseus serve`` subprocess on free ports, small profiles, helpers."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from perseus.profiles import load_profile
from perseus_common.proto import perseus_pb2 as pb
from perseus_common.proto import perseus_pb2_grpc as pb_grpc
from perseus_server import ServerProcess

ROOT = Path(__file__).resolve().parents[2]
#: The leader lease of the servers a standby test starts: a standby takes over within seconds.
LEASE = ["--leader-lease", "1.5"]
A40 = ROOT / "profiles" / "gpt3-175b_a40_8stage.csv"
BLOCKING_A40 = 70.38


def sliced_profile_csv(stages: int = 2, every: int = 10) -> str:
    """The A40 profile cut to ``stages`` stages and every ``every``-th frequency (6 clocks)."""
    p = load_profile(A40)
    keep = set(p.frequencies[::every])
    rows = [r for r in p.records() if r["stage"] < stages and r["frequency"] in keep]
    return "stage,instruction,frequency,time,energy\n" + "".join(
        f"{r['stage']},{r['instruction']},{r['frequency']},{r['time']!r},{r['energy']!r}\n"
        for r in rows
    )


@pytest.fixture(scope="session")
def small_csv() -> str:
    return sliced_profile_csv()


@pytest.fixture(scope="session")
def small_freqs(small_csv: str) -> list[int]:
    return sorted({int(line.split(",")[2]) for line in small_csv.splitlines()[1:]}, reverse=True)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One server (no auth) shared by the tests of a module.

    No replan dwell, so tests may detect a straggler and its recovery in a few reports
    (tests/server/service/test_stragglers_replan_guards.py checks the dwell).
    """
    db = tmp_path_factory.mktemp("db") / "perseus.db"
    with ServerProcess(db, extra_args=["--replan-dwell", "0"]) as srv:
        yield srv


@pytest.fixture(scope="module")
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.http_url, headers=server.headers, timeout=30.0) as c:
        yield c


@pytest.fixture(scope="module")
def stub(server: ServerProcess) -> Iterator[pb_grpc.PlanServiceStub]:
    channel = grpc.insecure_channel(server.grpc_target)
    yield pb_grpc.PlanServiceStub(channel)
    channel.close()


def make_job(http: httpx.Client, **overrides: Any) -> str:
    body = {
        "stages": 2,
        "microbatches": 4,
        "schedule": "1f1b",
        "blocking_power": BLOCKING_A40,
        "gpu_model": "A40",
    }
    body.update(overrides)
    r = http.post("/jobs", json=body)
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def wait_frontier(
    http: httpx.Client,
    job_id: str,
    timeout: float = 120.0,
    until: tuple[str, ...] = ("done", "failed"),
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = http.get(f"/jobs/{job_id}/frontier", params={"points": False}).json()
        if st["status"] in until:
            return dict(st)
        time.sleep(0.1)
    raise AssertionError(f"frontier of {job_id} not {until} after {timeout} s: {st}")


def solved_job(http: httpx.Client, csv_text: str, **overrides: Any) -> str:
    job_id = make_job(http, **overrides)
    r = http.put(f"/jobs/{job_id}/profile", content=csv_text, headers={"content-type": "text/csv"})
    assert r.status_code == 200, r.text
    assert http.post(f"/jobs/{job_id}/frontier").status_code == 202
    st = wait_frontier(http, job_id)
    assert st["status"] == "done", st
    return job_id


def register(
    stub: pb_grpc.PlanServiceStub,
    job_id: str,
    global_rank: int,
    pipeline_rank: int,
    data_rank: int = 0,
    clocks: list[int] | None = None,
    metadata: Any = (),
    tensor_rank: int = 0,
) -> pb.RegisterRankResponse:
    return stub.RegisterRank(
        pb.RegisterRankRequest(
            job_id=job_id,
            global_rank=global_rank,
            pipeline_rank=pipeline_rank,
            data_rank=data_rank,
            tensor_rank=tensor_rank,
            gpu_name="NVIDIA A40",
            supported_clocks_mhz=clocks or [],
            hostname="test",
        ),
        metadata=metadata,
        timeout=10,
    )


def register_all(
    stub: pb_grpc.PlanServiceStub, job_id: str, stages: int, data_parallel: int = 1, tp: int = 1
) -> list[str]:
    """Register every rank of a job: its pipelines can run and draw on a power budget."""
    return [
        register(stub, job_id, (d * stages + s) * tp + t, s, data_rank=d, tensor_rank=t).rank_id
        for d in range(data_parallel)
        for s in range(stages)
        for t in range(tp)
    ]


def problem_field(r: httpx.Response) -> str | None:
    assert r.headers["content-type"].startswith("application/problem+json"), r.text
    return r.json().get("field")


def wait_until(cond: Callable[[], Any], what: str, timeout: float = 120.0) -> Any:
    """``cond()``'s first true value, polled every 50 ms; an ``AssertionError`` naming ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def leader_and_standby(url: str, **options: Any) -> tuple[ServerProcess, ServerProcess]:
    """Two servers on one database (``options`` for both); the second one's start() waits.

    It waits as a standby as long as the test takes (its start-up allowance covers the wait, not
    only the start). Neither is started.
    """
    return (
        ServerProcess(url, extra_args=LEASE, **options),
        ServerProcess(url, extra_args=LEASE, startup_timeout=600.0, **options),
    )


def start_standby(srv: ServerProcess) -> threading.Thread:
    """Start ``srv`` on a thread (its ``start()`` returns once it leads); wait until it listens."""

    def start() -> None:
        with contextlib.suppress(RuntimeError):  # stopped before it led (the test's end)
            srv.start()

    t = threading.Thread(target=start, daemon=True)
    t.start()
    wait_until(lambda: srv.http_url and "perseus: standby" in srv.output(), "the standby")
    return t


@contextlib.contextmanager
def in_process_app(db: Path, token: str | None = None) -> Iterator[httpx.Client]:
    """The REST app over a service on a real SQLite file at ``db``, called through its ASGI stack.

    No server process: for a route's own tests. With ``token``, the app requires it and the
    client sends it.
    """
    from fastapi.testclient import TestClient

    from perseus_server.config import Limits
    from perseus_server.rest import create_app
    from perseus_server.runtime.sql_store import SqlStore
    from perseus_server.service import PerseusService

    store = SqlStore.open(db)
    try:
        app = create_app(PerseusService(store, Limits()), token=token)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        with TestClient(app, base_url="http://localhost", headers=headers) as client:
            yield client
    finally:
        store.close()
