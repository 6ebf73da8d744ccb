"""The power timeline of a plan (``perseus.power_timeline``) against an event simulation.

The simulation is written apart from the module: ranks take their instructions in schedule
order, each starting when its rank is free and its inputs have arrived (a queue of events, not
the longest-path kernel), and the power is then *sampled* on a fine grid (every GPU its
instruction's ``e / t`` or the blocking power), the measures read off the samples by brute
force. The two agree within 0.1 %.
"""

from __future__ import annotations

import heapq

import numpy as np
import numpy.typing as npt
import pytest

from perseus.power_timeline import PowerTimeline, plan_timeline, rank_power, window_key
from perseus.problem import EnergyProblem
from perseus.schedules import gpipe, one_f_one_b

BLOCKING = 83.64
FloatArray = npt.NDArray[np.float64]


def simulate(problem: EnergyProblem, plan: npt.NDArray[np.uint8]) -> tuple[FloatArray, FloatArray]:
    """Start and end of every node by discrete events (ranks in order, inputs first)."""
    dag = problem.dag
    n = problem.num_nodes
    d = problem.times[np.arange(n), plan.astype(np.int64)]
    preds = [set(dag.pred_idx[dag.pred_ptr[v] : dag.pred_ptr[v + 1]].tolist()) for v in range(n)]
    start = np.full(n, np.nan)
    end = np.full(n, np.nan)
    waiting = {v: len(p) for v, p in enumerate(preds)}
    succs: dict[int, list[int]] = {v: [] for v in range(n)}
    for v, p in enumerate(preds):
        for u in p:
            succs[u].append(v)
    events: list[tuple[float, int]] = [(0.0, v) for v in range(n) if waiting[v] == 0]
    heapq.heapify(events)
    ready_at = np.zeros(n)
    while events:
        t, v = heapq.heappop(events)
        start[v], end[v] = t, t + d[v]
        for w in succs[v]:
            ready_at[w] = max(ready_at[w], end[v])
            waiting[w] -= 1
            if waiting[w] == 0:
                heapq.heappush(events, (float(ready_at[w]), w))
    return start, end


def sampled_power(
    problem: EnergyProblem, plan: npt.NDArray[np.uint8], dt: float
) -> tuple[float, FloatArray]:
    """The pipeline's power sampled every ``dt`` over one iteration, and the iteration time."""
    start, end = simulate(problem, plan)
    n = problem.num_nodes
    e = problem.energies[np.arange(n), plan.astype(np.int64)]
    period = float(end.max())
    t = (np.arange(int(period / dt)) + 0.5) * dt
    power = np.full((problem.dag.num_ranks, len(t)), BLOCKING)
    for v in range(n):
        if end[v] > start[v]:
            on = (t >= start[v]) & (t < end[v])
            power[problem.dag.rank[v], on] += e[v] / (end[v] - start[v]) - BLOCKING
    return period, power.sum(axis=0)


def brute_change(samples: FloatArray, dt: float, window: float) -> float:
    """Largest difference between two samples less than ``window`` apart (periodic)."""
    k = int(round(window / dt))
    ext = np.concatenate([samples, samples[:k]])
    view = np.lib.stride_tricks.sliding_window_view(ext, k)[: len(samples)]
    return float((view.max(axis=1) - view.min(axis=1)).max())


@pytest.fixture(scope="module", params=["1f1b-4x6", "gpipe-3x4"])
def problem(request: pytest.FixtureRequest, slice_profile) -> EnergyProblem:
    if request.param == "1f1b-4x6":
        return EnergyProblem.build(slice_profile([0, 2, 5, 7]), one_f_one_b(4, 6), BLOCKING)
    return EnergyProblem.build(slice_profile([1, 3, 6]), gpipe(3, 4), BLOCKING)


def plans(problem: EnergyProblem) -> list[npt.NDArray[np.uint8]]:
    rng = np.random.default_rng(7)
    out = [problem.max_frequency_plan()]
    for _ in range(3):
        out.append((rng.random(problem.num_nodes) * problem.num_options).astype(np.uint8))
    return out


def test_timeline_agrees_with_an_event_simulation(problem: EnergyProblem) -> None:
    dt = 2e-5
    for plan in plans(problem):
        tl = plan_timeline(problem, plan)
        period, samples = sampled_power(problem, plan, dt)
        truth = problem.evaluate(plan)
        assert tl.period == pytest.approx(period, rel=1e-9)
        assert tl.energy == pytest.approx(truth.energy, rel=1e-9)
        assert tl.energy == pytest.approx(samples.sum() * dt, rel=1e-3)
        assert tl.peak == pytest.approx(samples.max(), rel=1e-3)
        assert tl.trough == pytest.approx(samples.min(), rel=1e-3)
        for window in (0.01, 0.1):
            assert tl.max_change(window) == pytest.approx(
                brute_change(samples, dt, window), rel=1e-3
            )


def test_band_share_agrees_with_a_sampled_spectrum(problem: EnergyProblem) -> None:
    dt = 2e-5
    plan = plans(problem)[1]
    tl = plan_timeline(problem, plan)
    period, samples = sampled_power(problem, plan, dt)
    spec = np.abs(np.fft.rfft(samples - samples.mean())) ** 2
    freq = np.fft.rfftfreq(len(samples), dt)
    for band in ((0.1, 20.0), (0.0, 5.0), (30.0, 200.0)):
        inside = (freq >= band[0]) & (freq <= band[1]) & (freq > 0)
        want = spec[inside].sum() / spec[1:].sum()
        assert tl.band_share(band) == pytest.approx(want, abs=2e-3)


def test_copies_scale_the_job_and_ranks_add_up(problem: EnergyProblem) -> None:
    plan = plans(problem)[2]
    ranks = rank_power(problem, plan)
    assert ranks.watts.min() >= BLOCKING - 1e-9
    job = plan_timeline(problem, plan, pipelines=3, tensor_parallel=2)
    assert np.allclose(job.watts, 6 * ranks.watts.sum(axis=0))
    assert job.swing == pytest.approx(plan_timeline(problem, plan).swing)


def test_definitions_on_a_hand_made_timeline() -> None:
    # 1 s period: 100 W for 0.4 s, 400 W for 0.5 s, 250 W for 0.1 s.
    tl = PowerTimeline(np.array([0.0, 0.4, 0.9, 1.0]), np.array([100.0, 400.0, 250.0]))
    assert (tl.peak, tl.trough) == (400.0, 100.0)
    assert tl.swing == pytest.approx(0.75)
    assert tl.energy == pytest.approx(40 + 200 + 25)
    assert tl.max_change(0.05) == pytest.approx(300.0)  # the step at 0.4 s
    # Across the period's end: 250 W then 100 W; 0.1 s reaches from 0.9 to 0.4 only when > 0.1.
    assert tl.max_change(0.2) == pytest.approx(300.0)
    assert tl.max_change(5.0) == pytest.approx(300.0)
    flat = PowerTimeline(np.array([0.0, 2.0]), np.array([500.0]))
    assert (flat.swing, flat.max_change(0.1), flat.band_share()) == (0.0, 0.0, 0.0)
    doc = tl.to_json(windows=(0.1, 0.25))
    assert set(doc["max_change_w"]) == {window_key(0.1), window_key(0.25)} == {"0.1", "0.25"}
    with pytest.raises(ValueError, match="window"):
        tl.max_change(0.0)


def test_issue_table_gpt3_a100_8x12(a100) -> None:
    """The issue's numbers for all max clocks: 3,812 W peak, 1,046 W trough, 2,737 W in 100 ms."""
    problem = EnergyProblem.build(a100, one_f_one_b(8, 12), BLOCKING)
    tl = plan_timeline(problem, problem.max_frequency_plan())
    assert tl.peak == pytest.approx(3812, abs=1)
    assert tl.trough == pytest.approx(1046, abs=1)
    assert tl.swing == pytest.approx(0.73, abs=0.005)
    assert tl.max_change(0.1) == pytest.approx(2737, abs=1)
