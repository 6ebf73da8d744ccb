"""ProfilingSession's scan, driven offline by simulated measurements (no server)."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import numpy as np
import pytest

from perseus.problem import EnergyProblem
from perseus.profiles import load_profile, parse_profile_csv
from perseus.schedules import one_f_one_b
from perseus_client import SimulatedGpu
from perseus_server.decisions.profiling_scan import Measurement, ProfilingSession
from perseus_server.domain.states import ProfilingStatus
from perseus_server.models.status import ProfilingProgress

from ..conftest import A40, BLOCKING_A40

KINDS = ("forward", "backward")
#: (stage, kind, step index) -> (time, energy) of one instruction
Curve = Callable[[int, str, int], tuple[float, float]]


def drive(
    session: ProfilingSession,
    curve: Curve,
    *,
    stages: int = 2,
    microbatches: int = 4,
    noise: float = 0.0,
    seed: int = 0,
    blocking_power: float = 0.0,
    max_steps: int = 1000,
) -> list[int]:
    """Feed ``session`` one rank per stage until it stops; returns the clocks scanned.

    Each rank runs ``microbatches`` of every kind; its iteration lasts the slowest rank's busy
    time (a crude pipeline) and draws ``blocking_power`` while it waits.
    """
    rng = random.Random(seed)
    ranks = {f"r{s}": s for s in range(stages)}
    scanned = []
    for version in range(1, max_steps + 1):
        session.step_version = version
        f = session.frequency
        step = session.frequencies.index(f)
        scanned.append(f)
        for _ in range(1000):
            if session.step_complete(set(ranks), stages):
                break
            reports = {}
            for rid, s in ranks.items():
                ms = []
                for kind in KINDS:
                    t, e = curve(s, kind, step)
                    for _ in range(microbatches):
                        ms.append(
                            Measurement(
                                kind,
                                s,
                                f,
                                t * (1 + noise * rng.gauss(0, 1)),
                                e * (1 + noise * rng.gauss(0, 1)),
                            )
                        )
                reports[rid] = ms
            span = max(sum(m.time for m in ms) for ms in reports.values()) * 1.1
            for rid, ms in reports.items():
                busy_t, busy_e = sum(m.time for m in ms), sum(m.energy for m in ms)
                energy = busy_e + blocking_power * (span - busy_t)
                session.record(rid, version, energy, ms, iteration_time=span)
        else:
            raise AssertionError("the clock never completed")
        if session.advance():
            return scanned
    raise AssertionError("the scan never stopped")


def valley_curve(valleys: dict[int, int], freqs: int) -> Curve:
    """A curve with an energy valley per stage; time grows as the clock falls.

    Energy falls by 5 % a step down to ``valleys[stage]``, then rises by 5 % a step.
    """

    def curve(stage: int, kind: str, step: int) -> tuple[float, float]:
        v = valleys[stage]
        e = 10.0 * (0.95**step if step <= v else 0.95**v * 1.05 ** (step - v))
        return 0.1 * (1 + 0.02 * step) * (2 if kind == "backward" else 1), e

    return curve


def session(n: int = 12, **kwargs: float) -> ProfilingSession:
    args: dict[str, float] = {"warmup_iterations": 1, "iterations": 3, "stop_after_rises": 3}
    args.update(kwargs)
    return ProfilingSession(list(range(1500, 1500 - 50 * n, -50)), **args)  # type: ignore[arg-type]


def test_scan_goes_on_past_the_job_energy_minimum_while_an_instruction_still_falls() -> None:
    # Stage 0's cost bottoms out at step 2, stage 1's at step 6; the job's energy (the slowest
    # rank sets everyone's waiting) rises from early on.
    s = session()
    scanned = drive(s, valley_curve({0: 2, 1: 6}, 12), blocking_power=50.0)
    job_min = int(np.argmin(s.energies))
    assert s.rises >= s.stop_after_rises and job_min + s.stop_after_rises < len(scanned) - 1
    # It stops exactly when stage 1 has risen three times past its valley: step 6 + 3.
    assert len(scanned) == 10 and s.status is ProfilingStatus.RUNNING
    rises = s.instruction_rises()
    assert min(rises.values()) == 3 and rises[(0, "forward")] == 7
    assert s.progress()["consecutive_rises"] == 3
    assert parse_profile_csv(s.profile_csv()).frequencies == s.frequencies[:10]


def test_scan_stops_when_every_instruction_has_risen_and_at_the_end_of_the_list() -> None:
    s = session()
    assert len(drive(s, valley_curve({0: 1, 1: 1}, 12))) == 5  # both valleys at step 1: 1 + 3
    s = session(n=6)
    assert len(drive(s, valley_curve({0: 1, 1: 4}, 6))) == 6  # the list ends first


def test_the_valley_uses_the_effective_cost_with_the_blocking_power() -> None:
    # Energy bottoms out at step 2, but time rises 2 % a step: with P_b = 80 W the effective
    # cost e - P_b t still falls for longer, and the scan goes on.
    def curve(stage: int, kind: str, step: int) -> tuple[float, float]:
        return 0.1 * (1 + 0.05 * step), 10.0 * (
            0.97**step if step <= 2 else 0.97**2 * 1.01 ** (step - 2)
        )

    plain = session(blocking_power=0.0)
    effective = session(blocking_power=80.0)
    assert len(drive(plain, curve)) == 6
    assert len(drive(effective, curve)) > 6


def test_rises_before_the_cost_ever_fell_do_not_count() -> None:
    # A GPU that cannot hold its top clocks: the cost rises for four clocks, then falls to a
    # valley at step 8 (as the A40 profile's top clocks do).
    def curve(stage: int, kind: str, step: int) -> tuple[float, float]:
        e = [10, 10.2, 10.4, 10.6, 10.8, 9, 8, 7, 6, 6.5, 7, 7.5]
        return 0.1, e[step]

    assert len(drive(session(), curve)) == 12


def test_a_noisy_flat_cost_does_not_stop_the_scan_and_a_real_rise_does() -> None:
    def flat(stage: int, kind: str, step: int) -> tuple[float, float]:
        return 0.1, 10.0 * 0.99 ** min(step, 3)

    for seed in range(5):
        assert len(drive(session(n=20), flat, noise=0.02, seed=seed)) == 20

    def rising(stage: int, kind: str, step: int) -> tuple[float, float]:
        return 0.1, 10.0 * (0.9**step if step <= 3 else 0.9**3 * 1.1 ** (step - 3))

    assert len(drive(session(n=20), rising, noise=0.02, seed=1)) == 7


def test_a_seeded_noisy_gpu_on_the_a40_profile_scans_to_its_valleys() -> None:
    """SimulatedGpu ranks on the A40 profile's first two stages, 1.5 % noise.

    The job-energy rule stopped within the first clocks (the A40 cannot hold its top clocks);
    the scan goes down to the lowest clocks, where every instruction's effective cost has its
    valley.
    """
    true = load_profile(A40).select_stages(range(2))
    schedule = one_f_one_b(2, 4)
    dag = EnergyProblem.build(true, schedule, BLOCKING_A40).dag
    freqs = true.frequencies
    gpus = [
        SimulatedGpu.from_profile(true, stage=r, time_scale=0, noise=0.015, seed=r)
        for r in range(2)
    ]
    ranks = ["r0", "r1"]
    s = ProfilingSession(freqs, 1, 5, 3, blocking_power=BLOCKING_A40)
    job_rule_stop = None
    d = np.empty(dag.num_nodes)
    for version in range(1, len(freqs) + 1):
        s.step_version = version
        for g in gpus:
            g.set_locked_clocks(s.frequency)
        while not s.step_complete(set(ranks), 2):
            out: list[list[Measurement]] = [[], []]
            for i, op in enumerate(dag.ops):
                g = gpus[int(dag.rank[i])]
                t0, e0 = g.timestamp(), g.energy_mj()
                g.begin_instruction(op.kind, op.microbatch, op.stage)
                g.end_instruction()
                d[i] = g.timestamp() - t0
                m = Measurement(op.kind, op.stage, s.frequency, d[i], (g.energy_mj() - e0) / 1e3)
                out[int(dag.rank[i])].append(m)
            span = float(dag.iteration_time(d))
            for rid, ms in zip(ranks, out, strict=True):
                idle = span - sum(m.time for m in ms)
                energy = sum(m.energy for m in ms) + BLOCKING_A40 * idle
                s.record(rid, version, energy, ms, iteration_time=span)
        done = s.advance()
        if job_rule_stop is None and s.rises >= 3:
            job_rule_stop = len(s.energies)
        if done:
            break
    assert job_rule_stop is not None and job_rule_stop <= 10
    assert len(s.energies) >= len(freqs) - 3
    assert s.measured_blocking_power == pytest.approx(BLOCKING_A40, rel=1e-6)
    # Fewer iterations than measuring every clock five times, and the means are close.
    assert s.iterations_spent < len(s.energies) * 6
    measured = parse_profile_csv(s.profile_csv())
    for key, p in measured.entries.items():
        t = true[key]
        n = len(p.frequencies)
        assert list(p.frequencies) == list(t.frequencies[:n])
        assert np.allclose(p.energies, t.energies[:n], rtol=0.03)


def test_the_tolerance_cuts_iterations_and_keeps_the_means() -> None:
    curve = valley_curve({0: 4, 1: 6}, 12)
    fixed = session(tolerance=0.0, iterations=10)
    cut = session(tolerance=0.01, iterations=10)
    assert drive(fixed, curve, noise=0.01, seed=2) == drive(cut, curve, noise=0.01, seed=2)
    assert cut.iterations_spent < fixed.iterations_spent / 2
    a, b = parse_profile_csv(fixed.profile_csv()), parse_profile_csv(cut.profile_csv())
    for key, p in a.entries.items():
        assert np.allclose(p.energies, b[key].energies, rtol=0.02)
        assert np.allclose(p.times, b[key].times, rtol=0.02)
    # Noisier measurements are repeated more often, up to ``iterations``.
    noisy = session(tolerance=0.01, iterations=10)
    drive(noisy, curve, noise=0.05, seed=2)
    assert noisy.iterations_spent > cut.iterations_spent


def test_every_rank_is_measured_even_when_the_means_are_known() -> None:
    s = session(tolerance=0.5)
    s.step_version = 1
    ms = [Measurement(k, 0, s.frequency, 0.1, 10.0) for k in KINDS for _ in range(4)]
    s.record("r0", 1, 0.0, ms)
    assert s.record("r0", 1, 0.0, ms)
    ms1 = [Measurement(k, 1, s.frequency, 0.1, 10.0) for k in KINDS for _ in range(4)]
    assert not s.step_complete({"r0", "r1"}, 2)
    s.record("r1", 1, 0.0, ms1)
    assert not s.step_complete({"r0", "r1"}, 2)  # r1's first report was its warm-up
    s.record("r1", 1, 0.0, ms1)
    assert s.step_complete({"r0", "r1"}, 2)


def test_blocking_power_is_measured_per_clock_and_stored() -> None:
    s = session(blocking_power=0.0)
    drive(s, valley_curve({0: 1, 1: 1}, 12), blocking_power=83.64)
    assert s.measured_blocking_power == pytest.approx(83.64)
    assert all(p == pytest.approx(83.64) for p in s.blocking_powers)
    assert s.effective_blocking_power == pytest.approx(83.64)
    doc = s.to_json()
    assert doc["measured_blocking_power"] == pytest.approx(83.64)
    again = ProfilingSession.from_json(doc)
    assert again.measured_blocking_power == pytest.approx(83.64)
    assert again.to_json() == doc
    # Reports without an iteration time, or with unmeasured energies, tell nothing.
    t = session()
    t.step_version = 1
    ms = [Measurement("forward", 0, t.frequency, 0.1, 10.0)]
    t.record("r0", 1, 50.0, ms)
    t.record("r0", 1, 50.0, ms)
    t.record("r0", 1, 50.0, [Measurement("forward", 0, t.frequency, 0.1, 0.0)], iteration_time=1)
    t.advance()
    assert t.blocking_powers == [None] and t.measured_blocking_power is None


def test_progress_keeps_the_rest_models_keys() -> None:
    s = session()
    assert ProfilingProgress.model_validate(s.progress())
    drive(s, valley_curve({0: 1, 1: 2}, 12))
    prog = s.progress()
    assert ProfilingProgress.model_validate(prog)
    assert set(prog) == set(ProfilingProgress.model_fields)


def test_from_json_reads_a_session_stored_before_the_noise_aware_scan() -> None:
    old = {
        "frequencies": [1410, 1395, 1380, 1365],
        "warmup_iterations": 2,
        "iterations": 5,
        "stop_after_rises": 3,
        "step": 2,
        "step_version": 7,
        "status": "running",
        "error": None,
        "energies": [100.0, 90.0],
        "rises": 0,
        "sums": [
            [0, "forward", 1410, 1.0, 200.0, 10.0],
            [0, "forward", 1395, 1.1, 180.0, 10.0],
        ],
    }
    s = ProfilingSession.from_json(old)
    assert (s.step, s.step_version, s.status, s.frequency) == (2, 7, "running", 1380)
    assert s.blocking_power == 0.0 and s.tolerance == 0.0 and s.iterations_spent == 0
    assert s.waits == [[0.0, 0.0], [0.0, 0.0]] and s.measured_blocking_power is None
    stats = s.stats()[(0, "forward")]
    assert [f for f, _ in stats] == [1410, 1395]
    assert stats[1][1].energy == pytest.approx(18.0) and stats[1][1].cost_se == 0.0
    assert s.instruction_rises() == {(0, "forward"): 0}
    assert "0,forward,1395,0.11" in s.profile_csv()
    # It carries on: the next clock is measured with the tolerance it was stored without.
    ms = [Measurement("forward", 0, 1380, 0.1, 17.0)] * 4
    for _ in range(7):
        s.record("r0", 7, 0.0, ms)
    assert s.step_complete({"r0"}, 1) and not s.advance()
    assert s.frequency == 1365 and len(s.waits) == len(s.energies) == 3
    assert ProfilingSession.from_json(s.to_json()).to_json() == s.to_json()


def test_old_rule_equivalent_settings_still_measure_every_iteration() -> None:
    """``tolerance=0`` and ``noise_sigmas=inf`` give the fixed-repeat scan to the end."""
    s = session(tolerance=0.0, noise_sigmas=math.inf)
    scanned = drive(s, valley_curve({0: 1, 1: 1}, 12), noise=0.01)
    assert len(scanned) == 12 and s.iterations_spent == 12 * (1 + 3)
