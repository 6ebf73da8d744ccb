"""The power of the plans the server reports (``service/plan_powers.py``).

On a frontier really solved (two stages, four clocks of the A100 profile): the whole job's
average power scales with its pipelines, the per-GPU peak needs a profile that fits, and the
powers are computed once per frontier and profile. Plan documents over REST are
``tests/server/rest/test_plans_answers.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

from perseus.frontier import Frontier
from perseus.power import peak_powers, point_powers
from perseus.profiles import Profile
from perseus_server.domain.jobs import JobSpec
from perseus_server.domain.rows import JobRow
from perseus_server.service.plan_powers import PlanPowers, job_problem
from perseus_server.service.state import Job

from .conftest import BLOCKING


def _job(frontier: Frontier, profile: Profile | None, pipelines: int = 2) -> Job:
    spec = JobSpec(stages=2, microbatches=4, data_parallel=pipelines, blocking_power=BLOCKING)
    job = Job(row=JobRow("j", 0.0, spec), schedule=spec.build_schedule())
    if profile is not None:
        job.profile.set(profile, 1, "upload")
    job.frontier.set(frontier)
    return job


def test_the_powers_are_the_whole_jobs_and_computed_once(
    frontier: Frontier, profile: Profile
) -> None:
    job, powers = _job(frontier, profile), PlanPowers()
    got = powers.of(job)
    one = point_powers(frontier, pipelines=1, tensor_parallel=1)
    np.testing.assert_allclose(got.average, 2 * one)  # two pipelines
    problem = job_problem(job, frontier)
    assert problem is not None and got.peak is not None
    np.testing.assert_allclose(got.peak, peak_powers(frontier, problem))
    assert powers.of(job) is got
    job.profile.set(profile, 2, "upload again")  # the same profile object: still cached
    assert powers.of(job) is got
    powers.forget(job.id)
    assert powers.of(job) is not got


def test_a_point_carries_its_powers_and_a_cached_timeline(
    frontier: Frontier, profile: Profile
) -> None:
    job, powers = _job(frontier, profile), PlanPowers()
    last = len(frontier) - 1
    doc = powers.point(job, last)
    assert doc["average_power"] == pytest.approx(float(powers.of(job).average[last]))
    assert doc["peak_power"] is not None and doc["peak_power"] > 0
    assert doc["power_timeline"] is powers.timeline(job, last)  # computed once
    status = {"points": [{"index": 0}, {"index": last}]}
    powers.annotate_points(job, status)
    assert status["points"][1]["average_power"] == doc["average_power"]
    assert powers.of(job).average[0] >= powers.of(job).average[last]  # fastest draws most


def test_without_a_fitting_profile_there_is_no_peak_nor_timeline(frontier: Frontier) -> None:
    job, powers = _job(frontier, None), PlanPowers()
    assert job_problem(job, frontier) is None
    doc = powers.point(job, 0)
    assert doc["peak_power"] is None and doc["power_timeline"] is None
    assert doc["average_power"] > 0  # the average needs only the frontier
