"""The client's options: a few frozen, checked groups; the environment read in one place."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
from client_data import PROFILE

from perseus_client import (
    ConfigError,
    Connection,
    FailOpen,
    PerseusClient,
    RankPosition,
    Reporting,
    SimulatedGpu,
)


def test_the_constructor_takes_at_most_twelve_parameters() -> None:
    params = [p for p in inspect.signature(PerseusClient.__init__).parameters if p != "self"]
    assert len(params) <= 12, params
    assert {"rank", "connection", "fail_open", "reporting"} <= set(params)


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: RankPosition(pipeline_rank=-1), "pipeline_rank"),
        (lambda: RankPosition(tensor_rank=-2), "tensor_rank"),
        (lambda: Connection(rpc_timeout=0), "rpc_timeout"),
        (lambda: Connection(backoff_max=float("nan")), "backoff_max"),
        (lambda: FailOpen(server_timeout=-1), "server_timeout"),
        (lambda: FailOpen(clock_retry_initial=0), "clock_retry_initial"),
        (lambda: FailOpen(clock_retry_initial=5, clock_retry_max=1), "clock_retry_max"),
        (lambda: Reporting(report_interval=0), "report_interval"),
        (lambda: Reporting(clock_sample_interval=-1), "clock_sample_interval"),
    ],
)
def test_a_wrong_option_names_its_field_when_built(build, field) -> None:
    with pytest.raises(ConfigError) as e:
        build()
    assert e.value.field == field


def test_options_are_frozen_values() -> None:
    for value in (RankPosition(), Connection(), FailOpen(), Reporting()):
        with pytest.raises(dataclasses.FrozenInstanceError):
            value.__setattr__(dataclasses.fields(value)[0].name, None)
    assert Reporting(report_interval=1.0) == Reporting(report_interval=1.0)


def test_the_client_runs_with_its_options(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "7")
    gpu = SimulatedGpu(PROFILE, stage=1, time_scale=0.0)
    client = PerseusClient(
        offline=True,
        gpu=gpu,
        handle_signals=False,
        rank=RankPosition(pipeline_rank=1, data_rank=2, tensor_rank=3),
        fail_open=FailOpen(server_timeout=2.0),
        reporting=Reporting(measure_instructions=False, clock_sample_interval=0),
    )
    try:
        assert (client.global_rank, client.pipeline_rank, client.data_rank) == (7, 1, 2)
        assert client.tensor_rank == 3 and client.fail_open.server_timeout == 2.0
        assert client.clock_sampler is None  # sampling off
        with client.iteration(), client.instruction("forward", 0):
            pass
        assert client.last_report is not None and client.last_report.instructions == ()
    finally:
        client.close()
