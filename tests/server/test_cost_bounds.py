"""Cost proportional to size: every list, cache, queue and solve is bounded.

Paged job lists, bounded caches and solve queues, solves over their memory or time limit failing
with the limit named, a worker's half-written result never blocking, and the loop answering while
large reports are checked.

Bounds asserted here are generous ones that only a blocked loop or a runaway allocation breaks.
"""

from __future__ import annotations

import asyncio
import struct
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from perseus_common.proto import perseus_pb2 as pb
from perseus_common.proto import perseus_pb2_grpc as pb_grpc
from perseus_server import ServerProcess
from perseus_server.runtime.solve_manager import SolveEvents, SolveLimits, SolveManager, _read_all

from .conftest import make_job, register, solved_job, wait_frontier


def _custom_body(stages: int = 4, microbatches: int = 64) -> dict[str, Any]:
    from perseus_common.orders import one_f_one_b_orders

    orders = [[list(op) for op in o] for o in one_f_one_b_orders(stages, microbatches)]
    return {
        "stages": stages,
        "microbatches": microbatches,
        "schedule": {"name": "custom", "orders": orders},
        "blocking_power": 70.0,
    }


def test_job_list_pages_and_summarises(http: httpx.Client) -> None:
    ids = []
    for _ in range(3):
        r = http.post("/jobs", json=_custom_body())
        assert r.status_code == 201, r.text
        ids.append(r.json()["id"])
    full = http.get(f"/jobs/{ids[0]}").json()
    assert len(full["schedule"]["orders"]) == 4  # the job resource keeps the orders
    seen: list[dict[str, Any]] = []
    after = None
    while True:
        params: dict[str, Any] = {"limit": 2}
        if after is not None:
            params["after"] = after
        page = http.get("/jobs", params=params).json()
        assert len(page["jobs"]) <= 2
        seen += page["jobs"]
        if "next" not in page:
            break
        after = page["next"]
    listed = {j["id"]: j for j in seen}
    assert set(ids) <= set(listed)
    assert len(seen) == len(listed)  # no job twice
    for j in ids:
        assert listed[j]["schedule"] == {"name": "custom"}
        assert {k: v for k, v in listed[j].items() if k != "schedule"} == {
            k: v for k, v in http.get(f"/jobs/{j}").json().items() if k != "schedule"
        }
    assert http.get("/jobs", params={"after": "nope"}).status_code == 422
    assert http.get("/jobs", params={"limit": 0}).status_code == 422
    assert http.get("/jobs", params={"limit": 10**6}).status_code == 422


def test_a_half_written_result_ends_the_read(tmp_path: Path) -> None:
    """A worker that dies halfway through a message: the reader sees EOF, it does not hang."""
    import multiprocessing as mp

    reader, writer = mp.get_context("spawn").Pipe(duplex=False)
    # A length header promising 1 MiB, then a few bytes, then the (only) write end closes.
    writer._send(struct.pack("!i", 1 << 20) + b"partial")  # type: ignore[attr-defined]
    writer.close()
    out: list[Any] = []
    events = SolveEvents(lambda pid: None, lambda f: None, lambda *a: None, lambda r: None)
    loop = asyncio.new_event_loop()
    t = threading.Thread(target=lambda: out.append(_read_all(reader, events, loop)))
    t.start()
    t.join(60)
    loop.close()
    assert not t.is_alive(), "the read blocked on a half-written message"
    assert out == [("eof",)]


def test_the_solve_queue_is_bounded() -> None:
    async def run() -> None:
        mgr = SolveManager(0, limits=SolveLimits(max_queued=2))  # no worker slot: all wait
        events = SolveEvents(lambda pid: None, lambda f: None, lambda *a: None, lambda r: None)
        assert not mgr.queue_full()
        mgr.start("a", "", {}, 0.0, events)
        with pytest.raises(RuntimeError):
            mgr.start("a", "", {}, 0.0, events)  # one per job
        mgr.start("b", "", {}, 0.0, events)
        assert mgr.queued() == 2 and mgr.queue_full()
        for s in list(mgr._solves.values()):
            assert s.task is not None
            s.task.cancel()
        await asyncio.sleep(0)

    asyncio.run(run())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--solve-memory-mib", "40"], "memory budget of 40 MiB"),
        (["--solve-time-limit", "0.05"], "time limit of 0.05 s"),
    ],
)
def test_a_solve_over_its_limit_fails_naming_it(
    tmp_path: Path, small_csv: str, args: list[str], message: str
) -> None:
    with (
        ServerProcess(tmp_path / "perseus.db", extra_args=args) as srv,
        httpx.Client(base_url=srv.http_url, timeout=30.0) as http,
    ):
        job_id = make_job(http)
        r = http.put(
            f"/jobs/{job_id}/profile", content=small_csv, headers={"content-type": "text/csv"}
        )
        assert r.status_code == 200, r.text
        assert http.post(f"/jobs/{job_id}/frontier").status_code == 202
        st = wait_frontier(http, job_id)
        assert st["status"] == "failed", st
        assert message in st["error"], st
        assert "limit" in st["error"]
        # The server goes on: it answers, and the job can be solved again.
        assert http.get("/healthz").status_code == 200
        assert http.post(f"/jobs/{job_id}/frontier").status_code == 202
        assert wait_frontier(http, job_id)["status"] == "failed"


def test_large_reports_do_not_block_the_loop(
    http: httpx.Client, stub: pb_grpc.PlanServiceStub, small_csv: str, server: ServerProcess
) -> None:
    """Reports of 100k measurements each, sent back to back, while /healthz is polled.

    Every probe answers (a loop blocked for the whole run would time the probes out).
    """
    job_id = solved_job(http, small_csv, microbatches=1000)
    rank = register(stub, job_id, 0, 0).rank_id
    ops = [
        pb.InstructionMeasurement(
            instruction="forward", microbatch=i % 1000, frequency_mhz=1740, time=0.01, stage=0
        )
        for i in range(100_000)
    ]

    def reports() -> Any:
        for it in range(6):
            yield pb.IterationReport(
                job_id=job_id,
                rank_id=rank,
                iteration=it,
                iteration_time=1.0,
                plan_version=1,
                instructions=ops,
            )

    done = threading.Event()
    worst = [0.0]
    probes = [0]

    def probe() -> None:
        with httpx.Client(base_url=server.http_url, timeout=30.0) as c:
            while not done.is_set():
                t0 = time.perf_counter()
                assert c.get("/healthz").status_code == 200
                worst[0] = max(worst[0], time.perf_counter() - t0)
                probes[0] += 1
                time.sleep(0.01)

    t = threading.Thread(target=probe)
    t.start()
    try:
        ack = stub.ReportIterations(reports(), timeout=120)
    finally:
        done.set()
        t.join()
    assert ack.accepted == 6
    assert probes[0] > 0
    assert worst[0] < 10.0, worst  # generous: only a loop blocked for whole reports breaks it


def test_grpc_error_detail_for_unknown_rank(
    stub: pb_grpc.PlanServiceStub, http: httpx.Client
) -> None:
    job_id = make_job(http)
    big = pb.IterationReport(
        job_id=job_id,
        rank_id="nobody",
        iteration=0,
        iteration_time=1.0,
        instructions=[
            pb.InstructionMeasurement(instruction="forward", time=0.1, frequency_mhz=1000)
        ]
        * 1000,
    )
    with pytest.raises(grpc.RpcError) as e:
        stub.ReportIterations(iter([big]), timeout=30)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert e.value.details().startswith("rank_id")
