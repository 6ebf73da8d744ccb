"""``perseus_client.defaults``: the environment read once, and the default GPU backend it selects.

The backends are real: NVML's in dry-run mode on the node daemon's simulated NVML library (no
GPU here), the node daemon's client (never connected: the factory only builds it).
"""

from __future__ import annotations

import pytest

from perseus_client import ConfigError
from perseus_client.clock_control import FailOpenGpu
from perseus_client.defaults import Environment, backend_factory, default_gpu, env_int
from perseus_client.errors import GpudUnavailableError
from perseus_client.gpu import vendors
from perseus_client.gpu.daemon import DaemonGpu
from perseus_client.gpu.nvml import NvmlGpu, vendor
from perseus_gpud.simnvml import SimulatedNvml


def test_the_environment_is_read_once_and_parsed_where_used() -> None:
    env = Environment.read(
        {
            "PERSEUS_SERVER": "grpcs://s:1",
            "PERSEUS_JOB": "j",
            "PERSEUS_TOKEN": "",
            "RANK": "x",
            "LOCAL_RANK": "2",
            "PERSEUS_DRY_RUN": "1",
        }
    )
    assert (env.server, env.job, env.token, env.dry_run) == ("grpcs://s:1", "j", None, True)
    assert env.integer("LOCAL_RANK", None, 0) == 2
    assert env.integer("RANK", 4, 0) == 4  # given: the variable is not read
    with pytest.raises(ConfigError) as e:
        env.integer("RANK", None, 0)
    assert e.value.field == "RANK"


def test_unset_or_empty_is_the_default_and_flags_read_as_words() -> None:
    env = Environment.read({"RANK": " ", "PERSEUS_DRY_RUN": "false", "PERSEUS_TLS_CA": ""})
    assert env.integer("RANK", None, 3) == 3 and env.integer("LOCAL_RANK", None, 1) == 1
    assert not env.dry_run and env.tls_ca is None
    assert not Environment.read({"PERSEUS_DRY_RUN": "0"}).dry_run
    assert Environment.read({"PERSEUS_DRY_RUN": "yes"}).dry_run


def test_env_int_reads_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_RANK", "5")
    assert env_int("LOCAL_RANK", None, 0) == 5
    monkeypatch.setenv("LOCAL_RANK", "five")
    with pytest.raises(ConfigError, match="LOCAL_RANK: must be an integer, got 'five'"):
        env_int("LOCAL_RANK", None, 0)


def test_a_configured_daemon_socket_selects_the_daemons_gpu() -> None:
    env = Environment.read({"PERSEUS_GPUD_SOCKET": "/nonexistent/gpud.sock", "LOCAL_RANK": "0"})
    make = backend_factory(env)  # the daemon's, though none answers there
    with pytest.raises(GpudUnavailableError, match="/nonexistent/gpud.sock"):
        make()


def test_dry_run_opens_the_vendors_gpu_recording_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vendors, "VENDORS", (vendor(SimulatedNvml(2)),))
    env = Environment.read(
        {"PERSEUS_DRY_RUN": "1", "PERSEUS_GPUD_SOCKET": "/x.sock", "LOCAL_RANK": "1"}
    )
    gpu = backend_factory(env)()  # dry run: never the daemon, even with a socket set
    try:
        assert isinstance(gpu, NvmlGpu) and gpu.dry_run and gpu.identity().index == 1
    finally:
        gpu.close()


def test_a_negative_local_rank_is_refused_at_once() -> None:
    with pytest.raises(ConfigError, match="LOCAL_RANK: must be >= 0, got -1"):
        backend_factory(Environment.read({"LOCAL_RANK": "-1"}))


def test_the_default_gpu_never_raises_while_control_cannot_be_had() -> None:
    env = Environment.read({"PERSEUS_GPUD_SOCKET": "/nonexistent/gpud.sock"})
    gpu = default_gpu(retry_initial=60.0, retry_max=60.0, env=env)
    try:
        assert isinstance(gpu, FailOpenGpu)
        assert not isinstance(gpu.backend, DaemonGpu)  # not reached: fails open
    finally:
        gpu.close()
