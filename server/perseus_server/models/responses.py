"""Response models of the frontier and plan routes: frontiers, plans and deployments.

They stay here while :mod:`perseus_server.rest.plans` imports them from here (the other
features' models sit next to their routers in :mod:`perseus_server.rest`). Each model is the exact shape of a JSON body the service returns (same keys, in the same
order); see :mod:`perseus_server.models.base` for how optional keys are declared. Units: times
in seconds, energies in joules (per iteration), powers in watts, clocks in MHz, timestamps in
seconds since the Unix epoch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field, create_model

from perseus.policies import POLICIES, POLICY_NAMES
from perseus_common.wire.values import PlanStep
from perseus_server.domain.states import DeploymentKind, SolveStatus
from perseus_server.models.base import (
    JsonKey,
    JsonView,
    OptTimestamp,
    ResponseModel,
    Timestamp,
    omitted,
)

__all__ = [
    "FrontierPoint",
    "FrontierSummary",
    "FrontierStatus",
    "PlanStepJson",
    "PlanDoc",
    "PlanPolicyView",
    "PolicyName",
    "PipelineDeployment",
    "PlanDeployment",
    "ProfilingStepView",
    "ProfilingDeployment",
    "MaxClockDeployment",
    "DeploymentView",
    "FrontierState",
]

FrontierState = SolveStatus
_AVERAGE_POWER = (
    "Average power (W) of the whole job running this plan: data_parallel x tensor_parallel x "
    "energy / time."
)
_PEAK_POWER = (
    "Per GPU, the highest power (W) of any instruction's option in the plan (what a per-GPU "
    "power limit sees); null when the stored profile no longer matches the frontier's clocks."
)


# --- jobs ----------------------------------------------------------------------------------------


# --- profiles ------------------------------------------------------------------------------------


# --- frontier ------------------------------------------------------------------------------------


class FrontierPoint(ResponseModel):
    """One plan of the time-energy frontier."""

    index: int = Field(description="The point's index (0: the fastest plan).")
    time: float = Field(description="Iteration time (s), recomputed from the profile.")
    energy: float = Field(
        description="Energy per iteration (J), waiting at blocking power included."
    )
    lower_bound: float = Field(description="Certified lower bound on the energy at this time (J).")
    average_power: float = Field(description=_AVERAGE_POWER)
    peak_power: float | None = Field(description=_PEAK_POWER)


_Stale = Annotated[
    bool, Field(description="The frontier was computed from an older profile revision.")
]
_NumPoints = Annotated[int, omitted("Points of the frontier (absent before the first solve).")]
_Partial = Annotated[
    bool,
    omitted(
        "Present (true) when the stored frontier is only a solve's first plan (one point, a "
        "verified zero-slowdown plan): while status is ``partial`` the rest is being computed "
        "and replaces it; after a failed or cancelled solve it stays."
    ),
]
_MaxTime = Annotated[
    float, omitted("Iteration time (s) with every instruction at its maximum clock.")
]
_MaxEnergy = Annotated[
    float, omitted("Energy per iteration (J) with every instruction at its maximum clock.")
]


class FrontierSummary(ResponseModel):
    """The frontier computation's state (inside a job's status)."""

    status: FrontierState
    progress: float = Field(description="Fraction of the computation done, 0..1.")
    error: str | None = Field(description="Why the last computation failed, or null.")
    started: OptTimestamp
    finished: OptTimestamp
    solve_seconds: float | None = Field(description="Seconds the last solve took, or null.")
    stale: _Stale
    num_points: _NumPoints
    max_frequency_time: _MaxTime
    max_frequency_energy: _MaxEnergy
    partial: _Partial


class FrontierStatus(ResponseModel):
    """``GET /jobs/{id}/frontier``: the computation's state and, once computed, the frontier."""

    status: FrontierState
    progress: float = Field(description="Fraction of the computation done, 0..1.")
    error: str | None = Field(description="Why the last computation failed, or null.")
    started: OptTimestamp
    finished: OptTimestamp
    solve_seconds: float | None = Field(description="Seconds the last solve took, or null.")
    worker_pid: int | None = Field(description="The solver process while it runs, or null.")
    stale: _Stale
    num_points: _NumPoints
    max_frequency_time: _MaxTime
    max_frequency_energy: _MaxEnergy
    partial: _Partial
    points: list[FrontierPoint] = omitted(
        "Every point, fastest first (present once computed, unless ``points=false``)."
    )


# --- plans ---------------------------------------------------------------------------------------


#: A plan step in JSON (:func:`perseus.frontier.plan_json`): the wire's
#: :class:`~perseus_common.wire.values.PlanStep` itself, its clock under the key ``frequency``.
PlanStepJson = Annotated[
    PlanStep,
    JsonView(
        "One instruction of a rank's plan.",
        instruction=JsonKey("instruction", "forward, backward (or its input/weight halves)."),
        microbatch=JsonKey("microbatch"),
        stage=JsonKey("stage", "The model stage (virtual stage for interleaved schedules)."),
        frequency=JsonKey("frequency_mhz", "SM clock (MHz) to run it at."),
    ),
]


class PlanDoc(ResponseModel):
    """``GET /jobs/{id}/plan``: the frontier point a query selects."""

    index: int = Field(description="The frontier point.")
    time: float = Field(description="Iteration time (s).")
    energy: float = Field(description="Energy per iteration (J).")
    lower_bound: float = Field(description="Certified lower bound on the energy (J).")
    max_frequency_time: float = Field(description="Iteration time (s) at maximum clocks.")
    max_frequency_energy: float = Field(description="Energy per iteration (J) at maximum clocks.")
    slowdown: float = Field(description="time / max_frequency_time - 1 (0.05 = 5 % slower).")
    energy_savings: float = Field(description="1 - energy / max_frequency_energy.")
    frequencies: list[list[int]] = Field(
        description="Per pipeline rank, the SM clock (MHz) of each instruction in order."
    )
    average_power: float = Field(description=_AVERAGE_POWER)
    peak_power: float | None = Field(description=_PEAK_POWER)
    power_timeline: dict[str, Any] | None = Field(
        default=None,
        description="The job's power over one iteration (docs/power.md): period_s, peak_w, "
        "trough_w, swing (1 - trough/peak), average_w, max_change_w (per window, keyed by its "
        "seconds), band_hz and band_share; with the floors when swing bounds were given; null "
        "when the job's profile no longer describes the plans.",
    )
    partial: bool = omitted(
        "Present (true) when the job's frontier is only a solve's first plan: the query was "
        "answered from that one point (see ``GET /jobs/{id}/frontier``)."
    )
    steps: list[list[PlanStepJson]] = omitted(
        "Per pipeline rank, its instructions (``steps=true``)."
    )
    swing_bounds: dict[str, Any] = omitted("With swing bounds: the bounds asked for.")
    power_floors: list[list[list[float]]] = omitted(
        "With swing bounds: per pipeline rank, [start_s, end_s, watts] within one iteration "
        "(t = 0 at its start): that GPU draws at least watts then."
    )
    floor_energy: float = omitted("With swing bounds: joules per iteration the floors add (job).")
    energy_with_floors: float = omitted(
        "With swing bounds: joules per iteration of the plan and its floors (whole job)."
    )
    plan_is_frontier_point: bool = omitted(
        "With swing bounds: whether the plan is frontier point ``index`` itself (false: the "
        "search moved clocks from it; ``frequencies`` are the plan's)."
    )
    power_timeline_before: dict[str, Any] = omitted(
        "With swing bounds: the plan's timeline without its floors."
    )


# --- deployments ---------------------------------------------------------------------------------


if TYPE_CHECKING:
    PolicyName = str
else:
    #: A plan policy's name (:data:`perseus.policies.POLICY_NAMES`).
    PolicyName = Literal[POLICY_NAMES]


class _PlanPolicyBase(ResponseModel):
    """How the default plan is chosen: a policy, its value and its options.

    The policy is one of :data:`perseus.policies.POLICIES`; the options are ``eta``'s
    ``max_power``, as resolved when the policy was set.
    """

    kind: PolicyName
    value: float = Field(
        description="The policy's parameter: "
        + "; ".join(f"{p.name}: {p.parameter.description.rstrip('.')}" for p in POLICIES.values())
        + "."
    )
    copies: int = omitted(
        "``power_budget``: the job's data_parallel x tensor_parallel copies of one pipeline."
    )
    swing: dict[str, float] = omitted(
        "The swing bounds the deployed plan's power floors keep: max_swing, max_ramp, "
        "ramp_window (PUT /jobs/{id}/plan)."
    )


if TYPE_CHECKING:
    PlanPolicyView = _PlanPolicyBase
else:
    PlanPolicyView = create_model(
        "PlanPolicyView",
        __base__=_PlanPolicyBase,
        __doc__=_PlanPolicyBase.__doc__,
        __module__=__name__,
        **{
            o.name: (float, omitted(f"``{pol.name}``: {o.description}"))
            for pol in POLICIES.values()
            for o in pol.options
            if o.public
        },
    )


class PipelineDeployment(ResponseModel):
    """The plan one data-parallel pipeline runs."""

    pipeline: int
    index: int = Field(description="The frontier point (of the frontier named by ``frontier``).")
    frontier: Literal["job", "re-solved for its slow stage(s)"] = Field(
        description="``job``: the job's frontier; otherwise the pipeline's own, re-solved for "
        "its slow stages."
    )
    time: float = Field(description="The plan's iteration time (s).")
    energy: float = Field(description="The plan's energy per iteration (J).")
    reason: str = Field(description="Why this pipeline runs this plan.")
    average_power: float = Field(
        description="Average power (W) of this pipeline's tensor_parallel x ranks GPUs running "
        "its plan at its own time: tensor_parallel x energy / time."
    )
    peak_power: float | None = Field(description=_PEAK_POWER)


class _DeploymentBase(ResponseModel):
    version: int = Field(description="The plan version the ranks receive.")
    kind: str = Field(description="plan, profiling or max_clock.")
    reason: str
    deployed_at: Timestamp
    policy: PlanPolicyView


class PlanDeployment(_DeploymentBase):
    """Frontier plans, one per data-parallel pipeline."""

    kind: Literal[DeploymentKind.PLAN]
    pipelines: list[PipelineDeployment]
    partial: bool = omitted(
        "Present (true) when the job's frontier is only a solve's first plan: the pipelines run "
        "it until the whole frontier replaces it (a new version)."
    )
    average_power: float = Field(
        description="Average power (W) of the whole job: every pipeline waits for the slowest "
        "at blocking power (perseus.power.deployment_power)."
    )
    peak_power: float | None = Field(
        description="Per GPU, the highest power (W) of any instruction option any pipeline runs."
    )
    constraint: Literal["own policy", "power budget", "straggler", "power budget and straggler"] = (
        Field(
            description="What set the plans: the job's own policy, the cluster power budget, "
            "stragglers (the others slowed to them), or the budget with stragglers."
        )
    )
    power_timeline: dict[str, Any] = omitted(
        "The first pipeline's plan as the whole job draws it over one iteration (with its "
        "floors under swing bounds; then ``before`` without them): the measures of a plan "
        "document's power_timeline and ``samples`` ({t, w}: power w[k] W from t[k] s, at most "
        "400 steps) to draw."
    )
    swing: dict[str, Any] = omitted(
        "With swing bounds (PUT /jobs/{id}/plan max_swing / max_ramp): the bounds, the job's "
        "swing with the plan alone (plan_swing) and every rank's power_floors ([start_s, end_s, "
        "watts] within an iteration) of the first pipeline's plan, pushed with the plan."
    )


class ProfilingStepView(ResponseModel):
    """The frequency an online profiling scan measures now."""

    frequency: int = Field(description="SM clock (MHz) every instruction runs at.")
    warmup_iterations: int
    iterations: int = Field(description="Measured iterations per rank at this clock.")


class ProfilingDeployment(_DeploymentBase):
    """One step of an online profiling scan."""

    kind: Literal[DeploymentKind.PROFILING]
    profiling: ProfilingStepView


class MaxClockDeployment(_DeploymentBase):
    """Every instruction at one clock (while a measured profile is solved)."""

    kind: Literal[DeploymentKind.MAX_CLOCK]
    frequency: int = Field(description="SM clock (MHz).")


DeploymentView = Annotated[
    PlanDeployment | ProfilingDeployment | MaxClockDeployment, Field(discriminator="kind")
]
