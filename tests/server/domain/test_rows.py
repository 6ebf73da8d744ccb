"""``domain/rows.py``: the plain rows a store reads and writes, whichever database keeps them.

A row takes what a database driver hands back (a status as its string, a flag as an integer, a
number as a ``Decimal``) as the typed value, refuses a status the server does not know, and has
no field beyond its own.
"""

from __future__ import annotations

from decimal import Decimal

import pytest

from perseus_server.domain.jobs import JobSpec
from perseus_server.domain.rows import DEFAULT_TENANT, FrontierRow, JobRow, TenantRow
from perseus_server.domain.states import SolveStatus


def test_a_frontier_row_reads_its_status_and_flag_as_typed_values() -> None:
    row = FrontierRow("partial", 0.5, partial=1)  # type: ignore[arg-type]
    assert row.status is SolveStatus.PARTIAL and row.partial is True
    assert FrontierRow().status is SolveStatus.NONE and FrontierRow().partial is False


def test_a_status_the_server_does_not_know_is_refused() -> None:
    with pytest.raises(ValueError, match="'solving'"):
        FrontierRow("solving")  # type: ignore[arg-type]


def test_a_tenants_numbers_are_floats_whatever_the_driver_gave() -> None:
    row = TenantRow("team-a", 0.0, weight=Decimal("2.5"), guaranteed_watts=300)  # type: ignore[arg-type]
    assert (row.weight, row.guaranteed_watts) == (2.5, 300.0)
    assert type(row.weight) is float and type(row.guaranteed_watts) is float
    assert (row.max_jobs, row.max_gpus) == (None, None)  # the server's defaults


def test_a_job_without_a_tenant_is_the_default_tenants() -> None:
    row = JobRow("j1", 1.0, JobSpec(stages=2, microbatches=4))
    assert row.tenant == DEFAULT_TENANT == "default"


def test_a_row_has_no_field_beyond_its_own() -> None:
    row = FrontierRow()
    with pytest.raises(AttributeError):
        row.stauts = SolveStatus.DONE  # type: ignore[attr-defined]
