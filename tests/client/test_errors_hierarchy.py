"""``perseus_client.errors``: the client's exceptions and their places in one tree.

A training script catches everything the client raises as :class:`ClientError`; the fail-open
client relies on "clock control cannot be had now" being a :class:`ClockControlUnavailableError`;
a bad argument is also a ``ValueError`` naming its field. (Named ``test_errors_hierarchy.py``:
pytest imports test files outside packages by their bare names, and other apps have errors.)
"""

from __future__ import annotations

import pytest

from perseus_client import errors
from perseus_client.errors import (
    ClientError,
    ClockControlUnavailableError,
    ConfigError,
    GpudBusyError,
    GpudLeaseHeldError,
    GpudNotOwnerError,
    GpudPermissionError,
    GpudRefusedError,
    GpuDriverError,
    GpudUnavailableError,
    GpuError,
    GpuNotSupportedError,
    GpuPermissionError,
    PlanMismatchError,
    UnsupportedClockError,
)


def test_everything_the_client_raises_is_a_client_error() -> None:
    classes = [getattr(errors, name) for name in errors.__all__]
    assert all(issubclass(cls, ClientError) for cls in classes)
    assert issubclass(ClientError, Exception) and not issubclass(ClientError, ValueError)


def test_the_errors_keep_their_places_in_the_clients_tree() -> None:
    assert issubclass(GpudUnavailableError, ClockControlUnavailableError)
    assert issubclass(GpudPermissionError, GpuPermissionError)
    refusals = (GpudLeaseHeldError, GpudPermissionError, GpudNotOwnerError, GpudBusyError)
    assert all(issubclass(e, ClientError) for e in refusals)


def test_the_error_family() -> None:
    for cls in (GpudUnavailableError, GpudLeaseHeldError, GpuDriverError):
        assert issubclass(cls, ClockControlUnavailableError)


def test_what_the_fail_open_client_retries_and_what_it_does_not() -> None:
    for cls in (GpuPermissionError, GpuNotSupportedError, GpudNotOwnerError, GpudBusyError):
        assert issubclass(cls, ClockControlUnavailableError)
    for cls in (UnsupportedClockError, GpudRefusedError, ConfigError, PlanMismatchError):
        assert not issubclass(cls, ClockControlUnavailableError)
    assert issubclass(UnsupportedClockError, GpuError) and issubclass(
        UnsupportedClockError, ValueError
    )


def test_a_config_error_names_its_field_and_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="^job_id: must not be empty$") as info:
        raise ConfigError("job_id", "must not be empty")
    assert isinstance(info.value, ConfigError) and info.value.field == "job_id"


def test_a_refusal_keeps_the_daemons_code_and_a_mismatch_its_place() -> None:
    refused = GpudRefusedError("NOT_OWNER", "GPU 0 is not yours")
    assert (refused.code, str(refused)) == ("NOT_OWNER", "GPU 0 is not yours")
    mismatch = PlanMismatchError(
        "expected forward 1",
        executed=("backward", 0, 0),
        expected=("forward", 1, 0),
        position=3,
        plan_version=7,
    )
    assert (mismatch.executed, mismatch.expected) == (("backward", 0, 0), ("forward", 1, 0))
    assert (mismatch.position, mismatch.plan_version, str(mismatch)) == (3, 7, "expected forward 1")
