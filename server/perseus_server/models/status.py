"""Response models of an online profiling scan's progress.

``GET /jobs/{id}/profiling`` answers :class:`ProfilingStatus`; a job's status carries its
``profiling`` (:class:`ProfilingProgress`).

They stay in this module because of a name: the response model ``ProfilingStatus`` shares it
with the state enum :class:`perseus_server.domain.states.ProfilingStatus`, so the OpenAPI
document names both by their modules (``perseus_server__models__status__ProfilingStatus``), and
moving the model would rename a published schema.
"""

from __future__ import annotations

from pydantic import Field

from perseus_server.domain import states
from perseus_server.models.base import ResponseModel

__all__ = ["EnergyStep", "ProfilingProgress", "ProfilingStatus"]

ProfilingState = states.ProfilingStatus


class EnergyStep(ResponseModel):
    """The job's measured energy per iteration at one scanned clock."""

    frequency: int = Field(description="SM clock (MHz).")
    energy: float = Field(description="Energy per iteration (J), summed over the ranks.")


class ProfilingProgress(ResponseModel):
    """An online profiling scan: where it is and what it measured."""

    status: ProfilingState
    error: str | None = Field(description="Why the scan failed or was aborted, or null.")
    frequencies: list[int] = Field(description="Clocks to scan (MHz), highest first.")
    step: int = Field(description="Index into ``frequencies`` of the clock being measured.")
    current_frequency: int | None = Field(
        description="The clock being measured (MHz); null unless running."
    )
    plan_version: int = Field(description="The plan version of the current step.")
    warmup_iterations: int
    iterations_per_frequency: int
    stop_after_rises: int = Field(
        description="Consecutive clocks at which every instruction's effective cost (energy - "
        "blocking power x time) rose beyond the measurement noise after its lowest point; the "
        "scan then stops."
    )
    measured_iterations: dict[str, int] = Field(
        description="Per rank ID, iterations measured at the current clock."
    )
    energy_per_iteration: list[EnergyStep] = Field(description="One per finished clock.")
    consecutive_rises: int = Field(
        description="The fewest such rises (in a row, after its lowest point) of any "
        "instruction so far."
    )


class ProfilingStatus(ProfilingProgress):
    """``GET /jobs/{id}/profiling``."""

    ranks: int = Field(description="Registered ranks.")
