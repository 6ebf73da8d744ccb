"""The profile-mismatch rule (``service/stragglers.py``'s :class:`ProfileChecks`) on real job state.

The band, the healthiest pipeline, the hysteresis, and a new profile resetting it. The end-to-end
checks (status, metrics, no replans, the dwell) are in test_cluster_lifecycle.py.
"""

from __future__ import annotations

from perseus_server.domain.jobs import JobSpec
from perseus_server.domain.rows import JobRow
from perseus_server.service.state import Job
from perseus_server.service.stragglers import ProfileChecks


def _job(pipelines: int = 2) -> Job:
    spec = JobSpec(stages=2, microbatches=4, data_parallel=pipelines)
    return Job(row=JobRow("j1", 0.0, spec), schedule=spec.build_schedule())


def test_mismatch_needs_a_full_window_outside_the_band() -> None:
    checks, job = ProfileChecks((0.5, 2.0), iterations=4), _job()
    for _ in range(3):
        assert not checks.observe(job, 0, 0.02)  # three iterations: too few to tell
    assert checks.observe(job, 0, 0.02)
    view = checks.view(job)
    assert view is not None and view["ratio"] == 0.02 and "online profiling" in view["reason"]
    assert checks.reason(job) == view["reason"]


def test_a_straggler_does_not_make_a_mismatch() -> None:
    """The job's figure is its healthiest pipeline's: one pipeline 3x slower is a straggler."""
    checks, job = ProfileChecks((0.5, 2.0), iterations=4), _job()
    for _ in range(4):
        checks.observe(job, 0, 1.05)
        assert not checks.observe(job, 1, 3.0)
    assert checks.view(job) is None


def test_hysteresis_and_a_new_profile_clear_it() -> None:
    checks, job = ProfileChecks((0.5, 2.0), iterations=4), _job(1)
    for _ in range(4):
        checks.observe(job, 0, 3.0)
    assert checks.reason(job) is not None
    for _ in range(4):  # back inside the band but above sqrt(2): still flagged
        assert checks.observe(job, 0, 1.6)
    for _ in range(3):
        checks.observe(job, 0, 1.2)
    assert checks.reason(job) is None  # the median is within sqrt(0.5)..sqrt(2) now
    for _ in range(8):
        checks.observe(job, 0, 0.1)
    assert checks.reason(job) is not None
    job.profile.revision += 1  # a new profile is judged afresh
    assert checks.reason(job) is None and checks.view(job) is None
    assert not checks.observe(job, 0, 0.1)
