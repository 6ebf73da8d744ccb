"""Response models of a job's live state: status, ranks, stragglers, lifecycle.

``GET /jobs/{id}/status`` answers it (served by :mod:`.jobs`), and so do the straggler routes of
:mod:`.stragglers`; online profiling's part is in :mod:`perseus_server.models.status`.

Units: times in seconds, energies in joules (per iteration), clocks in MHz, timestamps in
seconds since the Unix epoch.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from perseus_server.domain.states import JobActivity, JobState, SlowStageStatus, StragglerSource
from perseus_server.models.base import ResponseModel, omitted
from perseus_server.models.responses import DeploymentView, FrontierSummary
from perseus_server.models.status import ProfilingProgress
from perseus_server.rest.power_budget import JobPowerBudget, JobPowerDraw

__all__ = [
    "LifecycleView",
    "DetectionSettings",
    "RecentIteration",
    "StragglerView",
    "SlowStagesView",
    "PipelineStatus",
    "RankStatus",
    "AppliedClocks",
    "OffPlanInstructionView",
    "Replan",
    "JobStatus",
    "MeasuredPowerView",
    "ProfileMismatchView",
]


class LifecycleView(ResponseModel):
    """Where a job is in its lifecycle (``docs/server.md``, "Job lifecycle")."""

    state: JobActivity = Field(
        description="active (ranks connected, or recently), idle (none for "
        "``--idle-after`` seconds), finished (``POST /jobs/{id}/finish``). Only active jobs "
        "share a cluster power budget."
    )
    since: float = Field(description="Since when (s since the Unix epoch).")
    reason: str = Field(description="Why it changed to this state.")
    idle_at: float | None = Field(
        description="When an active job without connected ranks becomes idle (Unix s); null "
        "when ranks are connected or it is not active."
    )


class DetectionSettings(ResponseModel):
    """Straggler detection: when a pipeline counts as slow, and when as recovered."""

    threshold: float = Field(
        description="Slow when an iteration takes this fraction longer than planned (0.05 = 5 %)."
    )
    consecutive: int = Field(description="Iterations in a row it takes to change state.")
    recovery: float = Field(
        description="Recovered when within this fraction of the plan (below threshold)."
    )


class RecentIteration(ResponseModel):
    """A pipeline's iteration: the slowest of its ranks' reported times."""

    iteration: int
    time: float = Field(description="Iteration time (s).")


class StragglerView(ResponseModel):
    """A pipeline known to be slow."""

    time: float = Field(description="Its iteration time T' (s) on the profile's time axis.")
    source: StragglerSource = Field(
        description="``detected`` from iteration reports, ``reported`` through the REST API, or "
        "``slow stage``: one of its stages runs slow and its frontier was re-solved for it."
    )
    cause: str | None = Field(
        default=None,
        description="``off-plan clocks`` while a rank of the pipeline runs off-plan (its GPU "
        "applied a clock more than one step below the plan's: power cap, thermal or hardware "
        "slowdown), else null.",
    )


class LinkView(ResponseModel):
    """One link of a pipeline and its measured transfer time.

    A link is a stage boundary in one direction.
    """

    boundary: int = Field(description="The boundary between model stage b and b + 1.")
    direction: str = Field(description="``forward`` (activations) or ``backward`` (gradients).")
    time: float = Field(description="Median of its latest measured iterations (s per microbatch).")
    baseline: float | None = Field(
        description="Its baseline (s): the profile's transfer time, else its first measured "
        "window's median; null until measured enough."
    )
    iterations: int = Field(description="Measured iterations the median is over.")


class SlowLinkView(ResponseModel):
    """A link whose measured transfer time grew past its baseline (see ``docs/server.md``)."""

    boundary: int
    direction: str
    time: float = Field(
        description="Its measured transfer time (s per microbatch) the re-solve uses."
    )
    baseline: float | None = Field(default=None, description="Its baseline (s), as ``links``'.")
    factor: float | None = Field(default=None, description="``time`` over ``baseline``.")


class SlowStagesView(ResponseModel):
    """A pipeline with slow stages, and its frontier re-solved for them."""

    factors: dict[str, float] = Field(
        description="Per stage (as a string key), how many times slower than profiled it runs."
    )
    status: SlowStageStatus
    solve_seconds: float = Field(description="Seconds the re-solve took (0 until done).")
    wall_seconds: float = Field(description="Seconds from detection to the re-solved frontier.")
    error: str | None = Field(description="Why the last re-solve failed, or null.")
    time: float | None = Field(
        description="The re-solved frontier's fastest iteration time (s), or null."
    )
    links: list[SlowLinkView] = Field(
        default_factory=list, description="The slow links the frontier was re-solved for."
    )


class PipelineStatus(ResponseModel):
    """One data-parallel pipeline."""

    pipeline: int
    recent_iterations: list[RecentIteration] = Field(description="Up to the 16 latest.")
    straggler: StragglerView | None
    slow_stages: SlowStagesView | None
    off_plan_ranks: list[int] = Field(
        default_factory=list,
        description="Global ranks of the pipeline that ran instructions off-plan in their "
        "latest iterations (see the ranks' ``applied_clocks``).",
    )
    links: list[LinkView] = Field(
        default_factory=list, description="Its links whose transfers the ranks time."
    )
    slow_links: list[SlowLinkView] = Field(
        default_factory=list,
        description="Its slow links: the pipeline's frontier is re-solved with their measured "
        "transfer times.",
    )


class OffPlanInstructionView(ResponseModel):
    """The latest off-plan instruction of a rank (the one farthest below its lock)."""

    iteration: int
    instruction: str
    microbatch: int
    stage: int
    locked_mhz: int = Field(description="The clock locked for it (MHz), the plan's.")
    sampled_mhz: int = Field(description="The lowest SM clock sampled while it ran (MHz).")
    reasons: list[str] = Field(description="NVML clock-event reasons seen while it ran off-plan.")


class AppliedClocks(ResponseModel):
    """A rank's applied-clock verification over its latest reported iterations."""

    off_plan: bool = Field(description="An instruction ran off-plan within the window.")
    window_iterations: int = Field(description="Reported iterations in the window (at most 16).")
    samples: int = Field(description="Applied-clock samples taken in the window.")
    off_plan_instructions: int = Field(
        description="Instructions in the window whose sampled SM clock was more than one "
        "supported step below the locked clock."
    )
    off_plan_iterations: int = Field(description="Iterations of the window with one or more.")
    reasons: list[str] = Field(
        description="NVML clock-event reasons seen in the window's off-plan instructions "
        "(sw_power_cap, hw_slowdown, sw_thermal_slowdown, hw_thermal_slowdown, ...)."
    )
    total_off_plan_instructions: int = Field(description="Since the server started.")
    last_off_plan: OffPlanInstructionView | None


class RankStatus(ResponseModel):
    """A registered rank."""

    rank_id: str
    global_rank: int
    pipeline_rank: int
    data_rank: int
    tensor_rank: int
    gpu_name: str
    supported_clocks_mhz: list[int] = Field(description="SM clocks (MHz) it supports, decreasing.")
    hostname: str
    max_power_limit: float = Field(
        default=0.0,
        description="Its GPU's maximum power limit (W, NVML's power-limit constraints); 0: not "
        "reported.",
    )
    connected: bool = Field(description="It holds a WatchPlan stream open.")
    last_iteration: int | None
    last_iteration_time: float | None = Field(description="Seconds, or null.")
    last_plan_version: int | None
    applied_clocks: AppliedClocks | None = Field(
        default=None,
        description="Applied-clock verification, or null: the rank reports no clock samples.",
    )
    clock_control: Literal["active", "unavailable"] | None = Field(
        default=None,
        description=(
            "Whether the rank controls its GPU's clocks (unavailable: it trains at the GPU's "
            "current clocks and retries); null: the rank does not say."
        ),
    )
    clock_control_reason: str | None = Field(
        default=None, description="Why clock control is unavailable; null while active."
    )


class Replan(ResponseModel):
    """A re-decision of the job's plans (a straggler, a recovery, a re-solve)."""

    time: float = Field(description="Seconds since the Unix epoch.")
    why: str
    version: int = Field(description="The plan version after it.")
    changed: bool = Field(description="It deployed a new plan version.")


class MeasuredPowerView(ResponseModel):
    """The job's power and energy as its ranks measured them (``docs/power.md``)."""

    average_power: float | None = Field(
        description="Measured average power (W, whole job) of the newest plan version any rank "
        "reported: the reporting ranks' energy / time, scaled to the job's world size."
    )
    plan_version: int = Field(description="The plan version ``average_power`` is of.")
    power_ranks: int = Field(description="Ranks whose reports of that version it averages.")
    power_iterations: int = Field(
        description="The fewest reports of that version from any of those ranks."
    )
    energy: float = Field(
        description="Measured energy (J, whole job) of the counted reports (every report with an "
        "energy reading, none from online profiling, since the server started)."
    )
    max_clock_energy: float | None = Field(
        description="What the same iterations, each as long as it was, would have taken at max "
        "clocks (J, whole job): every instruction at the top clock, waiting at blocking power; "
        "null when withheld (``withheld`` says why)."
    )
    energy_saved: float | None = Field(
        description="``max_clock_energy - energy`` (J, net: may be negative); null when "
        "withheld (``withheld`` says why)."
    )
    withheld: str = omitted(
        "Why the max-clock and saved figures are null: the job's profile does not describe its "
        "measured iterations (``profile_mismatch``)."
    )
    iterations: int = Field(description="The most reports counted from any one rank.")
    ranks: int = Field(description="Ranks with counted reports.")


class ProfileMismatchView(ResponseModel):
    """The job's measured iteration times are far from its plan's prediction."""

    ratio: float | None = Field(
        description="Measured / planned iteration time: the healthiest pipeline's median."
    )
    band: list[float] = Field(description="The band ``[low, high]`` the ratio must be in.")
    iterations: int = Field(description="Reported iterations per pipeline it is judged over.")
    since: float | None = Field(description="When it was found (s since the Unix epoch).")
    reason: str = Field(description="What it means and what to do (online profiling).")


class JobStatus(ResponseModel):
    """``GET /jobs/{id}/status``: ranks, deployment, pipelines, stragglers, profiling."""

    job_id: str
    state: JobState
    lifecycle: LifecycleView
    expected_ranks: int = Field(description="The job's world size.")
    registered_ranks: int
    connected_ranks: int
    plan: DeploymentView | None = Field(description="What the ranks run now, or null.")
    frontier: FrontierSummary
    pipelines: list[PipelineStatus]
    ranks: list[RankStatus] = Field(
        description="A page of the registered ranks, by global rank (``?ranks=`` per page, 64 "
        "unless asked, at most 1024; ``?after=`` a global rank)."
    )
    ranks_next: int | None = Field(
        default=None,
        description="The ``after`` of the next page of ranks, or null: this page is the last.",
    )
    straggler_detection: DetectionSettings
    iteration_overhead: float = Field(
        description="Common-mode ratio of observed to planned iteration time (1: none)."
    )
    recent_replans: list[Replan] = Field(description="Up to the 20 latest.")
    profiling: ProfilingProgress | None = Field(description="The last online profiling scan.")
    power_budget: JobPowerBudget | None = Field(
        description="The job's share of the cluster power budget, or null: not covered."
    )
    power_draw: JobPowerDraw | None = Field(
        default=None,
        description="What the job draws on a cluster power budget: only its pipelines whose "
        "every rank is connected count (their claim and demand), and why.",
    )
    measured: MeasuredPowerView | None = Field(
        description="Measured power and energy saved, or null until a rank reported energy.",
    )
    profile_mismatch: ProfileMismatchView | None = Field(
        description="Set while the measured iteration times are outside the band around the "
        "plan's prediction: energy-saved figures are withheld and straggler replanning paused."
    )
