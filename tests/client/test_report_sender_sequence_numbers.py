"""``perseus_client.report_sender``: sequence numbers and the registration a report waits on.

Each queued record gets one per rank, increasing; a batch re-sent after an error (the server stored
it, the answer was lost) carries the same numbers and the server acknowledges it as duplicates,
counting nothing twice; a restarted client numbers above everything it sent before. Against a
real server. A registration the rank owes goes before its next reports.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import pytest

from perseus_client.measurements import IterationMeasurement
from perseus_client.transport import ServerLink
from perseus_common.wire.values import RankRegistration
from perseus_server import ServerProcess

CSV = "stage,instruction,frequency,time,energy\n" + "".join(
    f"{s},{k},{f},{t},{e}\n"
    for s in (0, 1)
    for k, base in (("forward", 0.01), ("backward", 0.02))
    for f, t, e in ((1410, base, 3.0), (1000, base * 1.5, 2.4))
)


class _LostAnswer(grpc.RpcError):
    """What the client sees when the server stored a batch but its answer never arrived."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.DEADLINE_EXCEEDED

    def details(self) -> str:
        return "the answer was lost"


class _Recorder:
    """Wraps the link's stub: records sequence numbers and acks, and loses some answers.

    It records every batch's sequence numbers and the server's ack, and loses the answer of the
    next ``lose`` calls after the server took them.
    """

    def __init__(self, stub: Any) -> None:
        self.stub, self.lose = stub, 0
        self.batches: list[list[int]] = []
        self.acks: list[tuple[int, int]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stub, name)

    def ReportIterations(self, requests: Any, **kwargs: Any) -> Any:  # noqa: N802
        msgs = list(requests)
        self.batches.append([m.sequence for m in msgs])
        ack = self.stub.ReportIterations(iter(msgs), **kwargs)
        self.acks.append((ack.accepted, ack.duplicates))
        if self.lose:
            self.lose -= 1
            raise _LostAnswer()
        return ack


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, str]]:
    with ServerProcess(tmp_path_factory.mktemp("seq") / "perseus.db") as srv:
        with httpx.Client(base_url=srv.http_url, timeout=30.0) as http:
            job = http.post(
                "/jobs", json={"stages": 2, "microbatches": 2, "blocking_power": 70.0}
            ).json()["id"]
            r = http.put(f"/jobs/{job}/profile", content=CSV, headers={"content-type": "text/csv"})
            assert r.status_code == 200, r.text
        yield srv, job


def _reports_total(srv: ServerProcess) -> float:
    text = httpx.get(srv.http_url + "/metrics", timeout=10).text
    m = re.search(r"^perseus_iteration_reports_total(?:\{\})? (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


@contextlib.contextmanager
def _linked(srv: ServerProcess, job: str) -> Iterator[tuple[ServerLink, _Recorder]]:
    """A registered link for rank 0 of ``job`` with its stub recorded; closed after."""
    ident = RankRegistration(job, 0, 0, 0, 0, "NVIDIA A40", (), "test")
    # The reporter thread waits an hour between rounds: only the test's flush() sends.
    link = ServerLink(srv.grpc_target, ident, lambda plan: None, report_interval=3600.0)
    recorder = _Recorder(link._stub)
    link._stub = recorder  # type: ignore[assignment]
    link.start()
    try:
        assert link.wait_registered(20)
        yield link, recorder
    finally:
        link.close()


def _record(it: int) -> IterationMeasurement:
    return IterationMeasurement(it, 0.1, 0, 1.0, ())


def test_a_resent_batch_keeps_its_numbers_and_is_acknowledged_as_duplicates(
    served: tuple[ServerProcess, str],
) -> None:
    srv, job = served
    with _linked(srv, job) as (link, rec):
        before = _reports_total(srv)
        for it in range(3):
            link.submit(_record(it))
        rec.lose = 1
        assert link.flush() is False  # the answer was lost: the batch stays queued
        assert link.queued == 3
        assert link.flush() is True
        first, resent = rec.batches
        assert first == resent, "a re-sent batch must carry the same sequence numbers"
        assert first == sorted(first) and len(set(first)) == 3 and first[0] > 0
        assert rec.acks == [(3, 0), (3, 3)]  # stored once, then acknowledged and dropped
        assert link.duplicates == 3  # the client counts what the server called duplicates
        assert _reports_total(srv) == before + 3
        # New records number on, above the re-sent ones.
        link.submit(_record(3))
        assert link.flush() is True
        assert rec.batches[-1][0] > max(first) and rec.acks[-1] == (1, 0)
        assert _reports_total(srv) == before + 4
        last = rec.batches[-1][0]
    # A new client for the same rank (a restarted process) numbers above the old one.
    with _linked(srv, job) as (link, rec):
        link.submit(_record(4))
        assert link.flush() is True
        assert rec.batches[0][0] > last and rec.acks == [(1, 0)]
        assert _reports_total(srv) == before + 5


def test_a_partly_resent_batch_counts_only_the_new_records(
    served: tuple[ServerProcess, str],
) -> None:
    srv, job = served
    with _linked(srv, job) as (link, rec):
        before = _reports_total(srv)
        link.submit(_record(10))
        rec.lose = 1
        assert link.flush() is False
        link.submit(_record(11))  # queued behind the one to re-send
        assert link.flush() is True
        assert rec.batches[1][0] == rec.batches[0][0] and len(rec.batches[1]) == 2
        assert rec.acks[1] == (2, 1)
        assert link.duplicates == 1
        assert _reports_total(srv) == before + 2


def test_a_report_waits_for_the_registration_the_rank_owes(
    served: tuple[ServerProcess, str],
) -> None:
    # The clock control came up (its GPU's clocks now known) just before the last report: the
    # flush registers again first, so the server never reads "active" beside the clocks of the
    # old registration. The reporter thread sleeps an hour: only this flush can register.
    srv, job = served
    with _linked(srv, job) as (link, _):
        link.set_clock_control("active", "", gpu_name="NVIDIA A40", supported_clocks=(1410, 1000))
        link.submit(_record(0))
        assert link.flush() is True
        ranks = httpx.get(f"{srv.http_url}/jobs/{job}/status", timeout=10).json()["ranks"]
        (rank,) = [r for r in ranks if r["rank_id"] == link.rank_id]
        assert rank["clock_control"] == "active"
        assert rank["supported_clocks_mhz"] == [1410, 1000]
