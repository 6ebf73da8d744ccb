"""Bounded ``WatchPlan`` streams, over real gRPC streams to a real ``perseus serve``.

A rank holds one stream (a newer one replaces it, and the older ends with ABORTED saying so), and a
credential holds at most ``--max-streams-per-credential`` (one more is RESOURCE_EXHAUSTED naming the
limit).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import pytest

from perseus_common.proto import perseus_pb2, perseus_pb2_grpc
from perseus_server import ServerProcess
from perseus_server.domain.jobs import RankInfo
from perseus_server.runtime.hub import PlanHub, StreamLimitExceeded

pytestmark = pytest.mark.slow

TOKEN = "stream-token"
LIMIT = 3


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = ServerProcess(
        tmp_path_factory.mktemp("srv") / "perseus.db",
        token=TOKEN,
        extra_args=["--max-streams-per-credential", str(LIMIT)],
    ).start()
    try:
        yield srv
    finally:
        srv.stop()


def http(srv: ServerProcess) -> httpx.Client:
    return httpx.Client(base_url=srv.http_url, headers=srv.headers, timeout=30)


def wait_for(cond: Any, what: str, timeout: float = 30.0) -> Any:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


class Job:
    """A job of four ranks, registered over gRPC."""

    def __init__(self, srv: ServerProcess, channel: grpc.Channel) -> None:
        self.srv = srv
        self.stub = perseus_pb2_grpc.PlanServiceStub(channel)
        with http(srv) as c:
            r = c.post(
                "/jobs",
                json={"stages": 4, "microbatches": 4, "schedule": "1f1b", "blocking_power": 50.0},
            )
            assert r.status_code == 201, r.text
            self.id = str(r.json()["id"])
        self.rank_ids = [
            self.stub.RegisterRank(
                perseus_pb2.RegisterRankRequest(
                    job_id=self.id, global_rank=g, pipeline_rank=g, data_rank=0
                ),
                metadata=srv.grpc_metadata,
                timeout=30,
            ).rank_id
            for g in range(4)
        ]

    def watch(self, g: int) -> Any:
        return self.stub.WatchPlan(
            perseus_pb2.WatchPlanRequest(job_id=self.id, rank_id=self.rank_ids[g]),
            metadata=self.srv.grpc_metadata,
            timeout=60,
        )

    def connected(self) -> set[int]:
        with http(self.srv) as c:
            ranks = c.get(f"/jobs/{self.id}/status").json()["ranks"]
        return {r["global_rank"] for r in ranks if r["connected"]}


def ended(call: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        next(call)
    return info.value


def refused(job: Job, call: Any, g: int) -> grpc.RpcError:
    """How the stream of rank ``g`` opened past the limit ended.

    Fails as soon as the status shows it connected (one stream too many taken) instead of
    waiting for its deadline.
    """
    wait_for(lambda: not call.is_active() or g in job.connected(), f"stream {g} to be refused")
    assert not call.is_active(), f"the stream of rank {g} was taken past the limit of {LIMIT}"
    return ended(call)


def _rank(g: int) -> RankInfo:
    return RankInfo("job", f"rank-{g}", g, g, 0, 0, "", (), "")


def test_the_hub_takes_exactly_its_limit_of_streams_per_credential() -> None:
    hub = PlanHub(LIMIT)
    subs = [hub.subscribe(_rank(g), "token") for g in range(LIMIT)]
    with pytest.raises(StreamLimitExceeded, match=f"holds {LIMIT} WatchPlan streams"):
        hub.subscribe(_rank(LIMIT), "token")
    hub.subscribe(_rank(1), "token")  # replacing its own stream at the limit
    hub.subscribe(_rank(LIMIT), "another")  # another credential's streams are its own
    hub.unsubscribe(subs[0])
    hub.subscribe(_rank(LIMIT + 1), "token")  # a stream that ended gave its place back
    with pytest.raises(StreamLimitExceeded):
        hub.subscribe(_rank(0), "token")


def test_a_new_stream_for_a_rank_replaces_the_old_one(server: ServerProcess) -> None:
    with grpc.insecure_channel(server.grpc_target) as channel:
        job = Job(server, channel)
        current = job.watch(0)
        wait_for(lambda: job.connected() == {0}, "rank 0 connected")
        for _ in range(20):  # one rank opening stream after stream
            newer = job.watch(0)
            err = ended(current)  # ends as soon as the newer stream is subscribed
            assert err.code() == grpc.StatusCode.ABORTED
            assert err.details() == "rank_id: replaced by a newer WatchPlan stream for this rank"
            current = newer
        # The newest stream is the one that stays.
        assert job.connected() == {0}
        current.cancel()
        wait_for(lambda: job.connected() == set(), "the last stream to close")


def test_a_credential_holds_a_bounded_number_of_streams(server: ServerProcess) -> None:
    with grpc.insecure_channel(server.grpc_target) as channel:
        job = Job(server, channel)
        calls = [job.watch(g) for g in range(LIMIT)]
        wait_for(lambda: job.connected() == set(range(LIMIT)), "three ranks connected")
        err = refused(job, job.watch(LIMIT), LIMIT)
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert f"max_streams_per_credential = {LIMIT}" in err.details()
        assert job.connected() == set(range(LIMIT))
        # Replacing a rank's own stream stays possible at the limit.
        again = job.watch(1)
        assert ended(calls[1]).code() == grpc.StatusCode.ABORTED
        wait_for(lambda: job.connected() == set(range(LIMIT)), "rank 1 connected again")
        # A stream that ends gives its place back.
        calls[0].cancel()
        wait_for(lambda: 0 not in job.connected(), "rank 0 to disconnect")
        last = job.watch(LIMIT)
        wait_for(lambda: job.connected() == {1, 2, LIMIT}, "rank 3 connected")
        for call in (again, calls[2], last):
            call.cancel()
