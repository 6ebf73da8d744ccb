"""Perseus: the iteration time-energy frontier of pipeline-parallel training.

Also the per-instruction GPU frequency plans on that frontier.

The core library's public API. Names are imported on first use (PEP 562), so that importing
``perseus`` or a light part of it (profiles, schedules) never loads numba or scipy; the solver's
compiled kernels load when :func:`solve_frontier` (or anything else from the solver) is first
looked up::

    import perseus

    profile = perseus.load_profile("profiles/gpt3-175b_a100-sxm_8stage.csv")
    frontier = perseus.solve_frontier(profile, perseus.one_f_one_b(8, 12), 83.64)
    fastest = frontier.points[0]  # the zero-slowdown plan
    plan = frontier.plan_steps(frontier.index_for_deadline(1.1 * frontier.max_frequency_time))
    capped = perseus.plan_for_power_budget(frontier, 2200.0)  # the fastest plan within 2.2 kW

See ``docs/solver.md`` for the problem, the algorithm and :class:`SolverOptions`, and
``docs/power.md`` for power budgets (:mod:`perseus.power`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from perseus.dag import PipelineDAG
    from perseus.errors import (
        InfeasibleError,
        OptionError,
        PerseusError,
        ProfileError,
        ScheduleError,
        SolverCancelled,
    )
    from perseus.frontier import Frontier, FrontierPoint
    from perseus.power import (
        Allocation,
        PowerBudgetError,
        PowerJob,
        PowerPlan,
        allocate_power,
        plan_for_power_budget,
    )
    from perseus.problem import EnergyProblem, PlanEvaluation
    from perseus.profiles import (
        InstructionProfile,
        Profile,
        load_profile,
        parse_profile_csv,
        parse_profile_json,
    )
    from perseus.schedules import (
        Op,
        Schedule,
        gpipe,
        interleaved_1f1b,
        make_schedule,
        one_f_one_b,
    )
    from perseus.solver import RoundingOptions, SolverOptions, solve_frontier, solve_problem
    from perseus_common.communication import Communication, Phase, Transfer

#: Where each public name lives (imported from there on first use).
_EXPORTS: dict[str, str] = {
    # profiles: load, parse, write (Profile.to_csv / to_json)
    "Profile": "perseus.profiles",
    "InstructionProfile": "perseus.profiles",
    "load_profile": "perseus.profiles",
    "parse_profile_csv": "perseus.profiles",
    "parse_profile_json": "perseus.profiles",
    # a profile's communication (Profile.communication, Profile.with_communication)
    "Communication": "perseus_common.communication",
    "Transfer": "perseus_common.communication",
    "Phase": "perseus_common.communication",
    # schedules
    "Schedule": "perseus.schedules",
    "Op": "perseus.schedules",
    "gpipe": "perseus.schedules",
    "one_f_one_b": "perseus.schedules",
    "interleaved_1f1b": "perseus.schedules",
    "make_schedule": "perseus.schedules",
    # the DAG, the problem and the true evaluation of plans
    "PipelineDAG": "perseus.dag",
    "EnergyProblem": "perseus.problem",
    "PlanEvaluation": "perseus.problem",
    # the solver and its result
    "solve_frontier": "perseus.solver",
    "solve_problem": "perseus.solver",
    "SolverOptions": "perseus.solver",
    "RoundingOptions": "perseus.solver",
    "Frontier": "perseus.frontier",
    "FrontierPoint": "perseus.frontier",
    # power budgets: one job's fastest plan under a cap, one cap over several jobs
    "plan_for_power_budget": "perseus.power",
    "PowerPlan": "perseus.power",
    "PowerJob": "perseus.power",
    "allocate_power": "perseus.power",
    "Allocation": "perseus.power",
    "PowerBudgetError": "perseus.power",
    # errors
    "PerseusError": "perseus.errors",
    "ProfileError": "perseus.errors",
    "ScheduleError": "perseus.errors",
    "InfeasibleError": "perseus.errors",
    "OptionError": "perseus.errors",
    "SolverCancelled": "perseus.errors",
}

__all__ = [
    "Profile",
    "InstructionProfile",
    "load_profile",
    "parse_profile_csv",
    "parse_profile_json",
    "Communication",
    "Transfer",
    "Phase",
    "Schedule",
    "Op",
    "gpipe",
    "one_f_one_b",
    "interleaved_1f1b",
    "make_schedule",
    "PipelineDAG",
    "EnergyProblem",
    "PlanEvaluation",
    "solve_frontier",
    "solve_problem",
    "SolverOptions",
    "RoundingOptions",
    "Frontier",
    "FrontierPoint",
    "plan_for_power_budget",
    "PowerPlan",
    "PowerJob",
    "allocate_power",
    "Allocation",
    "PowerBudgetError",
    "PerseusError",
    "ProfileError",
    "ScheduleError",
    "InfeasibleError",
    "OptionError",
    "SolverCancelled",
    "__version__",
]


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("perseus")
    except PackageNotFoundError:
        return "0+unknown"


def __getattr__(name: str) -> Any:
    if name == "__version__":
        value: Any = _version()
    elif name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    else:
        raise AttributeError(f"module 'perseus' has no attribute {name!r}")
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
