"""What a client of the node daemon sees when it refuses: ``refusal`` and the errors' kinds.

``GpudConnection`` itself runs against a real daemon in ``tests/gpud``; here, every ``ErrorCode``
of ``gpud.proto`` becomes the exception the fail-open client relies on: the kinds that mean
"clock control cannot be had now" are ``ClockControlUnavailableError`` s (the client runs at the
GPU's clocks and retries), the others are plain refusals.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from perseus_client.errors import (
    ClockControlUnavailableError,
    GpudBusyError,
    GpudError,
    GpudLeaseHeldError,
    GpudNotOwnerError,
    GpudPermissionError,
    GpudRefusedError,
    GpudUnavailableError,
    GpuError,
)
from perseus_client.gpu.daemon_connection import GpudConnection, refusal
from perseus_common.proto import gpud_pb2

EXPECTED = {
    "LEASE_HELD": GpudLeaseHeldError,
    "PERMISSION_DENIED": GpudPermissionError,
    "NOT_OWNER": GpudNotOwnerError,
    "BUSY": GpudBusyError,
    "TIMEOUT": GpudBusyError,
}


@pytest.mark.parametrize("code", gpud_pb2.ErrorCode.keys())
def test_every_error_code_becomes_its_refusal(code: str) -> None:
    error = refusal(gpud_pb2.Error(code=gpud_pb2.ErrorCode.Value(code), message="why"))
    assert type(error) is EXPECTED.get(code, GpudRefusedError)
    assert (error.code, str(error)) == (code, "why")
    assert isinstance(error, GpudError) and isinstance(error, GpuError)
    retry_later = code in ("LEASE_HELD", "NOT_OWNER", "BUSY", "TIMEOUT", "PERMISSION_DENIED")
    assert isinstance(error, ClockControlUnavailableError) == retry_later


def test_no_daemon_is_unavailable_naming_the_socket(tmp_path: Path) -> None:
    path = tmp_path / "gpud.sock"
    with pytest.raises(GpudUnavailableError, match=str(path)):
        GpudConnection(str(path), timeout=1.0)
