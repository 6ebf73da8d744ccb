"""``PerseusClient.record_transfer``: timed P2P transfers travel with the iteration's report."""

from __future__ import annotations

import logging
import math
import time

import pytest
from client_data import PROFILE

from perseus_client import PerseusClient, SimulatedGpu
from perseus_client.reports import report_message
from perseus_common.proto import perseus_pb2


@pytest.fixture
def client(sim_gpu):
    c = PerseusClient(offline=True, gpu=sim_gpu, handle_signals=False)
    yield c
    c.close()


def _message(rec):
    return report_message(
        rec,
        job_id="j",
        rank_id="r",
        sequence=1,
        incarnation=7,
        clock_control="active",
    )


def test_transfers_of_an_iteration_are_in_its_record_and_message(client):
    with client.iteration():
        with client.instruction("forward", microbatch=0):
            pass
        client.record_transfer(0, "forward", 0, 0.002)
        client.record_transfer(0, "backward", 0, 0.003)
    assert client.last_report is not None
    assert client.last_report.transfers == ((0, "forward", 0, 0.002), (0, "backward", 0, 0.003))
    msg = perseus_pb2.IterationReport.FromString(_message(client.last_report).SerializeToString())
    assert [(t.boundary, t.direction, t.microbatch, t.time) for t in msg.transfers] == [
        (0, "forward", 0, 0.002),
        (0, "backward", 0, 0.003),
    ]


def test_each_iteration_reports_only_its_own_transfers(client):
    with client.iteration():
        client.record_transfer(1, "forward", 0, 0.001)
    with client.iteration():
        client.record_transfer(1, "forward", 1, 0.004)
    assert client.last_report.transfers == ((1, "forward", 1, 0.004),)


def test_outside_an_iteration_a_transfer_is_not_recorded(client):
    client.record_transfer(0, "forward", 0, 0.002)
    with client.iteration():
        pass
    client.record_transfer(0, "forward", 0, 0.002)
    assert client.last_report.transfers == ()


def test_transfers_the_server_would_refuse_are_dropped_off_the_training_thread(client, caplog):
    with client.iteration():
        client.record_transfer(0, "sideways", 0, 0.002)  # unknown direction
        client.record_transfer(-1, "forward", 0, 0.002)  # no such boundary
        client.record_transfer(0, "forward", 0, math.nan)
        client.record_transfer(0, "forward", 0, 0.0)  # a clock tick read 0: sent as tiny
        client.record_transfer(2, "backward", 3, 0.5)
    with caplog.at_level(logging.WARNING, logger="perseus_client.reports"):
        msg = _message(client.last_report)
    assert [(t.boundary, t.direction, t.microbatch) for t in msg.transfers] == [
        (0, "forward", 0),
        (2, "backward", 3),
    ]
    assert msg.transfers[0].time > 0


def _bracketed_energy(gpu: SimulatedGpu) -> tuple[float, float, float]:
    """``(before, joules, after)``: the energy counter and the simulated times that bound its read.

    The counter and the timestamp are two reads while the simulated GPU keeps drawing: the
    counter's own instant lies between the two timestamps, wherever the scheduler pauses.
    """
    before = gpu.timestamp()
    joules = gpu.energy_mj() / 1000.0
    return before, joules, gpu.timestamp()


def test_a_scaled_transfer_sleeps_its_scaled_time_and_idles_at_blocking_power():
    gpu = SimulatedGpu(PROFILE, stage=0, time_scale=0.5, blocking_power=50.0)
    gpu.set_transfer_time(1, "backward", 0.04)
    w0 = time.perf_counter()
    a0, e0, b0 = _bracketed_energy(gpu)
    gpu.transfer(1, "backward")
    assert time.perf_counter() - w0 >= 0.02  # 0.04 simulated seconds at time_scale 0.5
    a1, e1, b1 = _bracketed_energy(gpu)
    assert a1 - b0 >= 0.04 - 1e-9
    # Idle at the blocking power all along: 50 W over an interval the reads bound (each counter
    # read truncates to a whole mJ).
    assert 50.0 * (a1 - b0) - 0.002 <= e1 - e0 <= 50.0 * (b1 - a0) + 0.002
