"""The terms the cluster power budget works in (``service/budget_terms.py``).

Its stored settings, the share's words in a plan's reason, a job's straggler time and the
least-power fallback. The allocation over real jobs is ``test_power_budget.py``.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from perseus.power import PowerJob
from perseus_server.decisions.planner import Straggler
from perseus_server.domain.jobs import JobSpec
from perseus_server.domain.rows import JobRow
from perseus_server.domain.states import StragglerSource
from perseus_server.service.budget_terms import (
    BudgetSettings,
    BudgetShare,
    least_power_shares,
    straggler_time,
)
from perseus_server.service.state import Job


def test_settings_round_trip_through_their_stored_json() -> None:
    for settings in (
        BudgetSettings(900.0),
        BudgetSettings(1500.5, "min_energy", ("a", "b"), "keep_current"),
    ):
        doc = json.loads(json.dumps(settings.to_json()))
        assert BudgetSettings.from_json(doc) == settings
    # A budget stored before on_infeasible existed reads with its default.
    old = BudgetSettings.from_json({"watts": 700, "policy": "throughput", "jobs": ["a"]})
    assert old == BudgetSettings(700.0, "throughput", ("a",), "least_power")


def test_a_share_describes_the_budget_the_jobs_watts_and_its_point() -> None:
    share = BudgetShare("power_budget", 3.0, budget=900.0, rule="throughput", watts=412.3456789)
    assert share.describe() == (
        "cluster power budget 900 W (throughput): 412.346 W for this job, frontier point 3"
    )
    short = BudgetShare("power_budget", 0.0, budget=100.0, watts=150.0, feasible=False)
    assert short.describe().endswith("(the budget is unreachable: least power)")


def test_the_straggler_time_is_the_slowest_stragglers() -> None:
    spec = JobSpec(stages=2, microbatches=4, data_parallel=3)
    job = Job(row=JobRow("j", 0.0, spec), schedule=spec.build_schedule())
    assert straggler_time(job) is None
    job.stragglers.stragglers[0] = Straggler(0, 2.0, StragglerSource.REPORTED)
    job.stragglers.stragglers[2] = Straggler(2, 3.5, StragglerSource.DETECTED)
    assert straggler_time(job) == 3.5


def test_least_power_shares_put_every_job_at_its_least_power_point() -> None:
    a = PowerJob(
        "a", 8, np.array([1.0, 1.2, 1.5]), np.array([800.0, 600.0, 500.0]),
        np.array([0, 4, 9]), 1.0,
    )  # fmt: skip
    b = PowerJob("b", 4, np.array([2.0, 2.5]), np.array([300.0, 310.0]), np.array([1, 2]), 1.6)
    (sa, sb) = least_power_shares([a, b])
    assert (sa.name, sa.index, sa.watts, sa.time, sa.gpus) == ("a", 9, 500.0, 1.5, 8)
    assert sa.slowdown == pytest.approx(0.5)
    assert (sb.name, sb.index, sb.watts, sb.time) == ("b", 1, 300.0, 2.0)
    assert sb.slowdown == pytest.approx(0.25)
