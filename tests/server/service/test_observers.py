"""The observer contract, run over every observer the service registers.

The :class:`~perseus_server.service.observers.ReportObserver` contract, run over every observer the
service registers (as ``test_detector_contract.py`` does for detectors), and the report pipeline's
own: each accepted report goes to every observer once, in the registered order; a re-sent one to
none; a deleted job is forgotten by all.

The observers run in-process over a real service and store: a database as the first release
wrote it gives a job with a frontier, a deployed plan and a reported straggler, so the
detectors have something to hold.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from perseus_common.wire.values import (
    InstructionReport,
    IterationReport,
    OffPlanReport,
    RankRegistration,
    TransferReport,
)
from perseus_server.config import Limits
from perseus_server.domain.jobs import JobSpec
from perseus_server.metrics import Metrics
from perseus_server.runtime.sql_store import SqlStore
from perseus_server.service import PerseusService
from perseus_server.service.context import ServiceContext
from perseus_server.service.report_checks import CheckedReport
from perseus_server.service.reports import Reports
from perseus_server.service.state import Job, JobTable

from ..sqlite_backend import JOB, RANK, VERSION, first_release_database

#: Every observer the service registers, in its order: a new one fails
#: :func:`test_the_service_registers_every_observer_in_order` until it is listed here, and then
#: runs the contract below. The detectors stand aside while a job is profiled and online
#: profiling comes last (it may end the scan); the stragglers update the profile checks the
#: slow links and slow stages consult, so they come first.
OBSERVERS = (
    "RankHistory",
    "ClockVerification",
    "MeasuredPower",
    "Stragglers",
    "SlowLinks",
    "SlowStageResolver",
    "OnlineProfiling",
)


@pytest.fixture
def service(tmp_path: Path, small_csv: str) -> Iterator[PerseusService]:
    """A service over a first-release database.

    Job ``JOB`` with a plan deployed (version ``VERSION``), its rank ``RANK`` (pipeline 0, stage
    0) and a second one (pipeline 1).
    """
    path = tmp_path / "perseus.db"
    first_release_database(path, small_csv)
    store = SqlStore.open(path)
    svc = PerseusService(store, Limits())
    svc.load()
    svc.registration.register(RankRegistration(JOB, 2, 0, 1, gpu_name="NVIDIA A40"))
    try:
        yield svc
    finally:
        store.close()


def _clock(service: PerseusService, job_id: str) -> int:
    profile = service.jobs.get(job_id).profile.current
    return max(profile.frequencies) if profile is not None else 1410


def _report(
    service: PerseusService, job_id: str, rank_id: str, it: int, **kw: Any
) -> IterationReport:
    """A report with every part a rank may send.

    Measurements, transfers, energy, an off-plan instruction and clock samples.
    """
    mhz = _clock(service, job_id)
    fields: dict[str, Any] = dict(
        job_id=job_id,
        rank_id=rank_id,
        iteration=it,
        iteration_time=1.5,
        plan_version=VERSION,
        energy=300.0,
        instructions=tuple(
            InstructionReport(kind, mb, mhz, 0.02, 4.0, 0)
            for mb in range(4)
            for kind in ("forward", "backward")
        ),
        transfers=tuple(TransferReport(0, "forward", mb, 0.001) for mb in range(4)),
        clock_samples=8,
        off_plan=(OffPlanReport("forward", 0, 0, mhz, mhz - 300, ("hw_slowdown",), 2),)
        if it % 2
        else (),
    )
    fields.update(kw)
    return IterationReport(**fields)


def _observer(service: PerseusService, name: str) -> Any:
    found = [o for o in service.reports.observers if type(o).__name__ == name]
    assert len(found) == 1, name
    return found[0]


def _checked(service: PerseusService, rep: IterationReport) -> CheckedReport:
    return service.reports.check(0, rep)


def _job_keys(observer: Any, job_id: str, service: PerseusService) -> list[str]:
    """Where ``observer`` holds something keyed by ``job_id``.

    A dict key or set member that is the id or a tuple holding it, in its own attributes (not in
    the service's shared parts or the other observers, which hold the job legitimately until
    they forget it).
    """
    others = {id(o) for o in service.reports.observers if o is not observer}
    found: list[str] = []

    def holds(k: Any) -> bool:
        return k == job_id or (isinstance(k, tuple) and job_id in k)

    def walk(x: Any, path: str, depth: int) -> None:
        if depth < 0 or id(x) in others:
            return
        if isinstance(x, (ServiceContext, JobTable, Metrics, Job)) or callable(x):
            return
        if isinstance(x, dict):
            for k, v in x.items():
                if holds(k):
                    found.append(f"{path}[{k!r}]")
                walk(v, f"{path}[{k!r}]", depth - 1)
        elif isinstance(x, (set, frozenset)):
            found.extend(f"{path} has {k!r}" for k in x if holds(k))
        elif isinstance(x, (list, tuple)):
            for i, v in enumerate(x):
                walk(v, f"{path}[{i}]", depth - 1)
        elif hasattr(x, "__dict__") and not (x is not observer and hasattr(x, "ctx")):
            for name, v in vars(x).items():
                walk(v, f"{path}.{name}", depth - 1)

    walk(observer, type(observer).__name__, 4)
    return found


# --- registration ---------------------------------------------------------------------------


def test_the_service_registers_every_observer_in_order(service: PerseusService) -> None:
    assert tuple(type(o).__name__ for o in service.reports.observers) == OBSERVERS


# --- the contract, over every observer ------------------------------------------------------


@pytest.mark.parametrize("name", OBSERVERS)
def test_an_observer_takes_a_report_of_a_job_without_a_plan(
    service: PerseusService, name: str
) -> None:
    """A job with no profile, frontier or plan.

    Every observer takes a full report without an error (the report is stored already) and
    publishes no plan.
    """
    view = service.create_job(JobSpec(stages=2, microbatches=4, blocking_power=70.0))
    job_id = str(view["id"])
    rank = service.registration.register(RankRegistration(job_id, 0, 0, 0)).rank_id
    observer = _observer(service, name)
    for it in range(4):
        rep = _report(service, job_id, rank, it, plan_version=0, instructions=())
        observer.observe(_checked(service, rep))
    job = service.jobs.get(job_id)
    assert job.deployment.version == 0 and job.deployment.current is None


@pytest.mark.parametrize("name", OBSERVERS)
def test_an_observer_keeps_nothing_of_a_job_it_forgot(service: PerseusService, name: str) -> None:
    observer = _observer(service, name)
    for it in range(6):
        for rank_id in (RANK, *[r for r in service.jobs.get(JOB).ranks.by_id if r != RANK]):
            observer.observe(_checked(service, _report(service, JOB, rank_id, it)))
    observer.forget(JOB)
    assert _job_keys(observer, JOB, service) == []
    observer.forget("no-such-job")  # forgetting a job never seen is no error


def test_the_forget_contract_is_not_vacuous(service: PerseusService) -> None:
    """The observers that keep a job's state off the job hold it until they forget it.

    Else the test above would pass on observers that keep nothing at all.
    """
    for it in range(6):
        service.reports.record([_report(service, JOB, RANK, it)])
    for name in ("MeasuredPower", "Stragglers"):
        assert _job_keys(_observer(service, name), JOB, service), name


def _detection_state(job: Job) -> tuple[Any, ...]:
    """What the detectors keep of a job, and its plan version."""
    slow = job.stragglers
    return (
        dict(slow.stragglers),
        dict(slow.stage_flags),
        dict(slow.stage_detector.seen),
        {k: list(v) for k, v in slow.links.recent.items()},
        dict(slow.links.flags),
        job.deployment.version,
    )


@pytest.mark.parametrize("name", OBSERVERS)
def test_an_observer_of_a_profiled_job_leaves_detection_to_the_scan(
    service: PerseusService, name: str
) -> None:
    """While a job is profiled, no observer but online profiling acts on its reports.

    The detectors stand aside (their state and the plan stay as they are, however slow the
    reports), and only the scan takes the links' transfer times.
    """
    if name == "OnlineProfiling":
        pytest.skip("the scan itself takes these reports")
    profile = service.jobs.get(JOB).profile.current
    assert profile is not None
    service.profiling.start(JOB, sorted(profile.frequencies, reverse=True)[:2], 0, 2, 2)
    job = service.jobs.get(JOB)
    before = _detection_state(job)
    observer = _observer(service, name)
    for it in range(8):
        rep = _report(
            service, JOB, RANK, it, iteration_time=9.0, plan_version=job.deployment.version
        )
        observer.observe(_checked(service, rep))
    assert _detection_state(job) == before


# --- the pipeline ---------------------------------------------------------------------------


class _Recorder:
    def __init__(self, name: str, log: list[tuple[str, Any]]) -> None:
        self.name, self.log = name, log

    def observe(self, checked: CheckedReport) -> None:
        self.log.append((self.name, checked.report.iteration))

    def forget(self, job_id: str) -> None:
        self.log.append((self.name, job_id))


def test_each_new_report_goes_to_every_observer_once_in_order(service: PerseusService) -> None:
    log: list[tuple[str, Any]] = []
    reports = Reports(service.ctx, [_Recorder("a", log), _Recorder("b", log)])
    new, dup = reports.record_counted(
        [reports.check(0, _report(service, JOB, RANK, it, sequence=it + 1)) for it in range(3)]
    )
    assert (new, dup) == (3, 0)
    assert log == [("a", 0), ("b", 0), ("a", 1), ("b", 1), ("a", 2), ("b", 2)]
    log.clear()
    resent = reports.check(0, _report(service, JOB, RANK, 1, sequence=2))
    assert reports.record_counted([resent]) == (0, 1)
    assert log == []  # a re-sent report is acknowledged and observed by nobody
    reports.forget(JOB)
    assert log == [("a", JOB), ("b", JOB)]


def test_deleting_a_job_makes_every_observer_forget_it(service: PerseusService) -> None:
    import asyncio

    for it in range(6):
        service.reports.record([_report(service, JOB, RANK, it)])
    asyncio.run(service.delete_job(JOB))
    for observer in service.reports.observers:
        assert _job_keys(observer, JOB, service) == [], type(observer).__name__
