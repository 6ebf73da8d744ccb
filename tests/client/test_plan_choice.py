"""``perseus_client.plan_choice``: which plan a rank runs, and when it swaps one in.

The newest plan received, from the next iteration boundary on; none (the maximum clock) while the
server has been unreachable past ``FailOpen.server_timeout``; a mismatch logged once per client.
On a real ``PerseusClient`` with a recording simulated GPU; the unreachable server is a port
nothing listens on.
"""

from __future__ import annotations

import logging
import socket
import time

from client_data import ORDER, STEPS, run_iteration

from perseus_client import FailOpen, PerseusClient


def test_no_plan_means_max_clock(client, rec):
    run_iteration(client)
    assert {i.mhz for i in rec.instructions} == {1410}
    assert client.plan_version == 0


def test_new_plan_swaps_in_only_at_the_iteration_boundary(client, rec, plan_of):
    client.use_plan(plan_of(1, STEPS))
    with client.iteration():
        for n, (k, m) in enumerate(ORDER):
            if n == 2:  # a new version arrives mid-iteration
                client.use_plan(plan_of(2, [(k2, m2, 1000) for k2, m2 in ORDER]))
            with client.instruction(k, microbatch=m):
                pass
    assert client.plan_version == 1
    assert [i.mhz for i in rec.instructions] == [1200, 1000, 1410, 1200]
    run_iteration(client)
    assert client.plan_version == 2
    assert [i.mhz for i in rec.instructions[4:]] == [1000] * 4
    assert client.last_report.plan_version == 2


def test_non_strict_mismatch_logs_once_and_runs_at_max(rec, plan_of, caplog):
    c = PerseusClient(offline=True, gpu=rec, strict=False, handle_signals=False)
    c.use_plan(plan_of(1, STEPS))
    with caplog.at_level(logging.WARNING, logger="perseus_client"):
        for _ in range(2):
            run_iteration(c, [("forward", 1), ("forward", 0), ("backward", 0), ("backward", 1)])
    c.close()
    assert [i.mhz for i in rec.instructions] == [1410] * 8
    assert sum("expects forward(microbatch 0" in r.getMessage() for r in caplog.records) == 1


def test_an_offline_client_has_no_link_and_the_latest_plan_waits(client, plan_of):
    assert not client.connected and client.rank_id is None
    assert client.plan is None and client.latest_plan is None
    client.use_plan(plan_of(3, STEPS))
    assert client.latest_plan.version == 3 and client.plan is None  # until the boundary
    run_iteration(client)
    assert client.plan is client.latest_plan and client.plan_version == 3
    client.use_plan(None)  # back to the maximum clock from the next iteration
    run_iteration(client)
    assert client.plan is None and client.plan_version == 0


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_past_the_fail_open_timeout_the_rank_runs_at_max_clock(rec, plan_of, caplog):
    c = PerseusClient(
        f"127.0.0.1:{_closed_port()}",
        "job",
        token="t",
        gpu=rec,
        handle_signals=False,
        fail_open=FailOpen(server_timeout=0.05),
    )
    try:
        c.use_plan(plan_of(1, STEPS))
        deadline = time.monotonic() + 30
        while c.link.unreachable_for() <= 0.05 and time.monotonic() < deadline:
            time.sleep(0.01)
        with caplog.at_level(logging.WARNING, logger="perseus_client"):
            run_iteration(c)
            run_iteration(c)
        assert c.failed_open and c.plan is None and not c.connected
        assert {i.mhz for i in rec.instructions} == {1410}
        assert sum("server unreachable" in r.getMessage() for r in caplog.records) == 1
    finally:
        c.close()
