"""Measured power and energy saved per job on a real server, from real gRPC report streams.

The status's ``measured`` and the ``/metrics`` series against figures computed here from the profile
and the frontier (``docs/power.md``).
"""

from __future__ import annotations

import math
import re
from typing import Any

import grpc
import httpx
import pytest

from perseus.profiles import parse_profile_csv
from perseus_common.proto import perseus_pb2 as pb
from perseus_common.proto import perseus_pb2_grpc as pb_grpc

from ..conftest import BLOCKING_A40, register, solved_job


def _max_clock_rank(csv_text: str, microbatches: int) -> dict[int, tuple[float, float]]:
    """Per pipeline rank of a 1F1B job with one stage per rank.

    The energy and busy time of its instructions at the profile's top clock, summed by hand.
    """
    prof = parse_profile_csv(csv_text)
    out = {}
    for s in range(prof.stages):
        e = t = 0.0
        for kind in ("forward", "backward"):
            entry = prof[(s, kind)]
            e += microbatches * float(entry.energies[0])
            t += microbatches * float(entry.times[0])
        out[s] = (e, t)
    return out


def _metric(text: str, name: str, job: str) -> float | None:
    m = re.search(rf'^{name}{{perseus_job="{job}"}} (\S+)$', text, re.M)
    return None if m is None else float(m.group(1))


class _Job:
    """A 2 x 2 job (two pipelines of two stages) with its four ranks registered."""

    def __init__(self, http: httpx.Client, stub: pb_grpc.PlanServiceStub, csv_text: str) -> None:
        self.http, self.stub = http, stub
        self.id = solved_job(http, csv_text, data_parallel=2)
        self.ranks = {
            (d, s): register(stub, self.id, d * 2 + s, s, data_rank=d).rank_id
            for d in (0, 1)
            for s in (0, 1)
        }
        self.seq = 0
        self.iteration = 0

    def status(self) -> dict[str, Any]:
        return dict(self.http.get(f"/jobs/{self.id}/status").json())

    def report(
        self, energies: dict[tuple[int, int], float], seconds: float, version: int, n: int = 1
    ) -> None:
        """``n`` iterations from the ranks in ``energies`` (J each), ``seconds`` long.

        One stream per rank, each report with a fresh sequence number.
        """
        for key, e in energies.items():
            reps = []
            for i in range(n):
                self.seq += 1
                reps.append(
                    pb.IterationReport(
                        job_id=self.id, rank_id=self.ranks[key], iteration=self.iteration + i,
                        iteration_time=seconds, plan_version=version, energy=e,
                        sequence=self.seq,
                    )
                )  # fmt: skip
            ack = self.stub.ReportIterations(iter(reps), timeout=10)
            assert ack.accepted == n and ack.duplicates == 0
        self.iteration += n


def test_measured_power_and_energy_saved_from_report_streams(
    http: httpx.Client, stub: pb_grpc.PlanServiceStub, small_csv: str
) -> None:
    job = _Job(http, stub, small_csv)
    st = job.status()
    assert st["measured"] is None  # no report with energy yet
    front = http.get(f"/jobs/{job.id}/frontier").json()
    t0, e0 = front["max_frequency_time"], front["max_frequency_energy"]
    base = _max_clock_rank(small_csv, 4)
    # the hand-summed max-clock energies give the frontier's E0 at T0 (waiting at blocking power)
    assert sum(c + BLOCKING_A40 * (t0 - b) for c, b in base.values()) == pytest.approx(e0)

    version = st["plan"]["version"]
    plan = st["plan"]["pipelines"][0]
    t, e = plan["time"], plan["energy"]
    # every rank reports what the plan predicts (its pipeline's energy split over its ranks)
    job.report({k: e / 2 for k in job.ranks}, t, version, n=5)
    m = job.status()["measured"]
    assert m["average_power"] == pytest.approx(st["plan"]["average_power"], rel=1e-9)
    assert m["average_power"] == pytest.approx(2 * e / t, rel=1e-9)
    assert m["plan_version"] == version and m["power_ranks"] == 4 and m["power_iterations"] == 5
    assert m["iterations"] == 5 and m["ranks"] == 4
    # saved: per pipeline and iteration, max clocks over the same t (E0 plus waiting) minus E
    per_iteration = e0 + 2 * BLOCKING_A40 * (t - t0) - e
    assert m["energy"] == pytest.approx(5 * 2 * e)
    assert m["max_clock_energy"] == pytest.approx(5 * 2 * (e0 + 2 * BLOCKING_A40 * (t - t0)))
    assert m["energy_saved"] == pytest.approx(5 * 2 * per_iteration)
    assert m["energy_saved"] > 0
    text = http.get("/metrics").text
    assert "# TYPE perseus_job_power_watts gauge" in text
    assert _metric(text, "perseus_job_power_watts", job.id) == pytest.approx(m["average_power"])
    assert _metric(text, "perseus_energy_saved_joules", job.id) == pytest.approx(m["energy_saved"])

    # a straggling iteration: the max-clock baseline waits as long, at blocking power
    before = m["energy_saved"]
    job.report({k: e / 2 + BLOCKING_A40 * 0.5 * t for k in job.ranks}, 1.5 * t, version)
    m = job.status()["measured"]
    assert m["energy_saved"] - before == pytest.approx(2 * per_iteration, rel=1e-9)

    # re-sent reports (the last rank's last sequence), reports without energy: nothing counted
    rep = pb.IterationReport(job_id=job.id, rank_id=job.ranks[(1, 1)], iteration=99,
                             iteration_time=t, plan_version=version, energy=1e6,
                             sequence=job.seq)  # fmt: skip
    assert stub.ReportIterations(iter([rep]), timeout=10).duplicates == 1
    job.report({k: 0.0 for k in job.ranks}, t, version)
    assert job.status()["measured"] == m

    # a new plan version: the power is that version's, from the ranks that ran it, scaled to
    # the job (only pipeline 0 reports: two of four ranks)
    dep = http.put(f"/jobs/{job.id}/plan", json={"slowdown": 0.1}).json()
    p2 = dep["pipelines"][0]
    job.report({(0, 0): 0.6 * p2["energy"], (0, 1): 0.4 * p2["energy"]}, p2["time"],
               dep["version"], n=3)  # fmt: skip
    m2 = job.status()["measured"]
    assert m2["plan_version"] == dep["version"] and m2["power_ranks"] == 2
    assert m2["power_iterations"] == 3
    assert m2["average_power"] == pytest.approx(dep["average_power"], rel=1e-9)
    # every rank has counted reports: the sums are the plain sums, per rank its own baseline
    measured = 2 * (5 * e + e + BLOCKING_A40 * t) + 3 * p2["energy"]
    assert m2["energy"] == pytest.approx(measured, rel=1e-9)
    rank_max = {s: c + BLOCKING_A40 * (t - b) for s, (c, b) in base.items()}
    rank_max_slow = {s: c + BLOCKING_A40 * (1.5 * t - b) for s, (c, b) in base.items()}
    rank_max_p2 = {s: c + BLOCKING_A40 * (p2["time"] - b) for s, (c, b) in base.items()}
    want_max = sum(5 * rank_max[s] + rank_max_slow[s] for d in (0, 1) for s in (0, 1)) + sum(
        3 * rank_max_p2[s] for s in (0, 1)
    )
    assert m2["max_clock_energy"] == pytest.approx(want_max, rel=1e-9)
    assert m2["energy_saved"] == pytest.approx(want_max - m2["energy"], rel=1e-9)


def test_measured_power_is_per_job_and_leaves_with_the_job(
    http: httpx.Client, stub: pb_grpc.PlanServiceStub, small_csv: str
) -> None:
    a, b = _Job(http, stub, small_csv), _Job(http, stub, small_csv)
    va, vb = a.status()["plan"]["version"], b.status()["plan"]["version"]
    a.report({k: 100.0 for k in a.ranks}, 1.0, va, n=2)
    b.report({(1, 1): 30.0}, 2.0, vb, n=2)
    assert a.status()["measured"]["average_power"] == pytest.approx(400.0)
    mb = b.status()["measured"]
    assert mb["average_power"] == pytest.approx(4 * 15.0) and mb["ranks"] == 1
    text = http.get("/metrics").text
    assert _metric(text, "perseus_job_power_watts", a.id) == pytest.approx(400.0)
    assert _metric(text, "perseus_job_power_watts", b.id) == pytest.approx(60.0)
    assert http.delete(f"/jobs/{a.id}").status_code == 204
    text = http.get("/metrics").text
    assert _metric(text, "perseus_job_power_watts", a.id) is None
    assert _metric(text, "perseus_energy_saved_joules", a.id) is None
    assert _metric(text, "perseus_job_power_watts", b.id) == pytest.approx(60.0)


def test_reports_that_would_overflow_keep_the_status_finite(
    http: httpx.Client, stub: pb_grpc.PlanServiceStub, small_csv: str
) -> None:
    job = _Job(http, stub, small_csv)
    version = job.status()["plan"]["version"]
    job.report({(0, 0): 100.0}, 1.0, version)
    for energy, seconds in ((1.0, 5e-324), (1e308, 1.0)):  # a power or sums that overflow
        with pytest.raises(grpc.RpcError) as e:  # are outside the reports' bounds
            job.report({(0, 0): energy}, seconds, version)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    for _ in range(2):  # a status does not change what it shows
        r = http.get(f"/jobs/{job.id}/status")
        assert r.status_code == 200
        m = r.json()["measured"]
        assert m["power_iterations"] == 1 and m["iterations"] == 1 and m["ranks"] == 1
        assert m["average_power"] == pytest.approx(400.0)
        assert m["energy"] == pytest.approx(400.0)
        for key in ("average_power", "energy", "max_clock_energy", "energy_saved"):
            assert math.isfinite(m[key])
    r = http.get("/metrics")
    assert r.status_code == 200
    assert _metric(r.text, "perseus_job_power_watts", job.id) == pytest.approx(400.0)
    # a sane report still counts
    job.report({(0, 0): 100.0}, 1.0, version)
    assert job.status()["measured"]["power_iterations"] == 2
