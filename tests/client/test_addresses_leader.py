"""How a rank's link moves between the addresses it was given, over real gRPC.

The servers here are small in-process gRPC servers of the test's own, speaking the real
protocol: they play what a real ``perseus serve`` never does on purpose (a server that lags
behind another's plan version, a standby naming a leader the rank was not given), so the
link's guarantees can be seen to hold. The real pair is in ``tests/server/test_standby.py``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest

from perseus_client.addresses import ServerAddress
from perseus_client.transport import ServerLink
from perseus_common.proto import perseus_pb2 as pb
from perseus_common.proto import perseus_pb2_grpc as pb_grpc
from perseus_common.wire.values import PlanUpdate, RankRegistration


class _Server(pb_grpc.PlanServiceServicer):
    """One server that sends plans, then ends the stream, or answers as a standby.

    It sends ``versions`` on each WatchPlan, then ends the stream UNAVAILABLE; or, with
    ``standby_for``, answers every call as a standby naming that leader.
    """

    def __init__(self, versions: tuple[int, ...] = (), standby_for: str | None = None) -> None:
        self.versions = versions
        self.standby_for = standby_for
        self.registrations = 0
        self.known: list[int] = []
        self.server = grpc.server(futures.ThreadPoolExecutor(4))
        pb_grpc.add_PlanServiceServicer_to_server(self, self.server)
        self.target = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.server.start()

    def RegisterRank(self, request: Any, context: Any) -> Any:  # noqa: N802
        self.registrations += 1
        if self.standby_for is not None:
            context.set_trailing_metadata((("perseus-leader", self.standby_for),))
            context.abort(grpc.StatusCode.UNAVAILABLE, "this server is a standby")
        return pb.RegisterRankResponse(rank_id="rank-0")

    def WatchPlan(self, request: Any, context: Any) -> Iterator[Any]:  # noqa: N802
        self.known.append(request.known_version)
        for v in self.versions:
            yield pb.PlanUpdate(version=v, reason=self.target)
        time.sleep(0.1)
        context.abort(grpc.StatusCode.UNAVAILABLE, "going away")


@pytest.fixture
def servers() -> Iterator[Callable[..., _Server]]:
    made: list[_Server] = []

    def make(*args: Any, **kwargs: Any) -> _Server:
        made.append(_Server(*args, **kwargs))
        return made[-1]

    yield make
    for s in made:
        s.server.stop(0)


def _link(targets: list[str], plans: list[PlanUpdate]) -> ServerLink:
    ident = RankRegistration("job", 0, 0, 0, 0, "NVIDIA A40", (), "test")
    return ServerLink(
        [ServerAddress(t, False) for t in targets],
        ident,
        plans.append,
        backoff_initial=0.02,
        backoff_max=0.2,
    )


def _wait(cond: Callable[[], Any], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def test_versions_never_go_back_across_servers(servers: Callable[..., _Server]) -> None:
    ahead, behind = servers((5,)), servers((2, 6))
    plans: list[PlanUpdate] = []
    link = _link([ahead.target, behind.target], plans)
    link.start()
    try:
        _wait(lambda: any(p.version == 6 for p in plans), "version 6 from the second server")
        _wait(lambda: ahead.registrations >= 2, "a second round (the first server again)")
        versions = [p.version for p in plans]
        assert versions[:2] == [5, 6]
        assert 2 not in versions  # the lagging server's older plan was dropped
        assert versions == sorted(versions)
        assert link.switches >= 2 and link.known_version == 6
        # Each subscription told the server what the rank already had.
        assert max(behind.known) >= 5
    finally:
        link.close()


def test_a_standby_sends_the_rank_to_the_leader_it_names(servers: Callable[..., _Server]) -> None:
    leader = servers((3,))
    standby = servers(standby_for=leader.target)
    plans: list[PlanUpdate] = []
    link = _link([standby.target], plans)  # the leader is not in the rank's list
    link.start()
    try:
        _wait(lambda: plans, "a plan from the leader")
        assert plans[0].reason == leader.target
        assert link.leader_hint == leader.target
        assert standby.registrations >= 1 and leader.registrations >= 1
    finally:
        link.close()


def test_registration_identity_is_kept_when_moving(servers: Callable[..., _Server]) -> None:
    a, b = servers((1,)), servers((1,))
    plans: list[PlanUpdate] = []
    link = _link([a.target, b.target], plans)
    incarnation = link.incarnation
    link.start()
    try:
        _wait(lambda: a.registrations >= 1 and b.registrations >= 1, "both servers")
        assert link.incarnation == incarnation and link.rank_id == "rank-0"
    finally:
        link.close()
