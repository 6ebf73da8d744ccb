"""Measured transfer times: per report, per clock, and the fit for the profile.

A report's time per link (median), the scan's samples per clock (kept with the persisted session),
and the fit online profiling gives the profile.
"""

from __future__ import annotations

import pytest

from perseus.profiles import parse_profile_csv
from perseus_common.communication import Communication, Phase, Transfer
from perseus_common.wire.values import TransferReport
from perseus_server.decisions.link_fit import (
    DEPENDENCE_Z,
    MIN_PER_CLOCK,
    SAMPLES_KEPT,
    STALE_ITERATIONS,
    LinkCombiner,
    TransferSamples,
    clock_dependence,
    clock_dependent,
    fit_transfers,
    link_times,
    median,
    with_measured_transfers,
)
from perseus_server.decisions.profiling_scan import Measurement, ProfilingSession


def test_a_reports_link_time_is_the_median_of_its_transfers() -> None:
    ts = [
        TransferReport(0, "forward", 0, 0.002),
        TransferReport(0, "forward", 1, 0.009),  # one transfer held up by the host
        TransferReport(0, "forward", 2, 0.0021),
        TransferReport(0, "backward", 0, 0.003),
        TransferReport(1, "forward", 0, 0.004),
        TransferReport(1, "forward", 1, 0.006),
    ]
    assert link_times(ts) == {
        (0, "forward"): 0.0021,
        (0, "backward"): 0.003,
        (1, "forward"): pytest.approx(0.005),
    }


def test_a_clock_dependence_beyond_the_noise_keeps_per_clock_medians() -> None:
    s = TransferSamples()
    for t in (0.0020, 0.0022, 0.0021, 0.0090):
        s.add(1410, {(0, "forward"): t})
    for t in (0.0025, 0.0026, 0.0027):
        s.add(1200, {(0, "forward"): t})
    for t in (0.0030, 0.0031, 0.0032):
        s.add(1000, {(0, "forward"): t})
    for t in (0.0035, 0.0036, 0.0037):
        s.add(800, {(0, "forward"): t})
    s.add(1410, {(0, "backward"): 0.004})
    fits = fit_transfers(s)
    assert fits[(0, "forward")].time == pytest.approx(0.00215)
    assert fits[(0, "forward")].times_by_clock == {
        800: pytest.approx(0.0036),
        1000: pytest.approx(0.0031),
        1200: pytest.approx(0.0026),
        1410: pytest.approx(0.00215),
    }
    assert fits[(0, "backward")].time == 0.004 and fits[(0, "backward")].times_by_clock is None
    assert TransferSamples.from_json(s.to_json()).samples == s.samples


def test_a_step_that_shifts_without_a_trend_in_the_clock_is_not_a_dependence() -> None:
    # Each step's reports agree (no within-clock noise), but the steps move up and down as the
    # host's load changes during the scan: the first test alone would keep per-clock times.
    per_clock = {
        1410: [0.0030, 0.0030, 0.0031],
        1350: [0.0011, 0.0010, 0.0010],
        1290: [0.0029, 0.0030, 0.0030],
        1230: [0.0010, 0.0011, 0.0010],
        1170: [0.0031, 0.0030, 0.0030],
    }
    assert clock_dependence(per_clock) > DEPENDENCE_Z
    assert not clock_dependent(per_clock)
    s = TransferSamples()
    for f, v in per_clock.items():
        for t in v:
            s.add(f, {(0, "forward"): t})
    [fit] = fit_transfers(s).values()
    assert fit.times_by_clock is None and fit.time == pytest.approx(0.0030)


def test_per_clock_differences_within_the_noise_give_one_robust_time() -> None:
    # A gloo link on a loaded host: the same 1 ms transfer, delayed by the host at random; the
    # per-clock medians differ (0.2 ms at one clock, 3.2 ms at another in the issue) by noise.
    s = TransferSamples()
    noisy = {
        1410: (0.0010, 0.0032, 0.0011, 0.0040, 0.0010),
        1200: (0.0034, 0.0010, 0.0035, 0.0012, 0.0033),
        1005: (0.0011, 0.0010, 0.0036, 0.0010, 0.0030),
    }
    for f, times in noisy.items():
        for t in times:
            s.add(f, {(0, "forward"): t})
    [fit] = fit_transfers(s).values()
    assert fit.times_by_clock is None
    assert fit.time == pytest.approx(median([t for ts in noisy.values() for t in ts]))
    assert clock_dependence({f: list(v) for f, v in noisy.items()}) < DEPENDENCE_Z


def test_too_few_reports_per_clock_do_not_make_a_dependence() -> None:
    s = TransferSamples()
    for f, t in ((1410, 0.001), (1410, 0.001), (1000, 0.002), (1000, 0.002)):
        s.add(f, {(0, "forward"): t})
    [fit] = fit_transfers(s).values()
    assert fit.times_by_clock is None and fit.time == pytest.approx(0.0015)


def test_samples_keep_the_latest_per_link_and_clock() -> None:
    s = TransferSamples()
    for i in range(SAMPLES_KEPT + 10):
        s.add(1410, {(0, "forward"): float(i)})
    kept = s.samples[(0, "forward", 1410)]
    assert len(kept) == SAMPLES_KEPT and kept[0] == 10.0


def test_the_session_keeps_transfers_of_kept_iterations_across_a_restart() -> None:
    s = ProfilingSession([1410, 1000], warmup_iterations=1, iterations=5, stop_after_rises=1)
    s.step_version = 3
    ms = [Measurement("forward", 0, 1410, 0.1, 1.0)]
    assert not s.record("r0", 3, 0.0, ms, transfers={(0, "forward"): 0.5})  # warm-up
    assert s.record("r0", 3, 0.0, ms, transfers={(0, "forward"): 0.002})
    assert not s.record("r0", 2, 0.0, ms, transfers={(0, "forward"): 0.7})  # an old version
    again = ProfilingSession.from_json(s.to_json())
    assert again.transfers.samples == {(0, "forward", 1410): [0.002]}


CSV = """stage,instruction,frequency,time,energy
0,forward,1410,0.1,10
0,backward,1410,0.2,20
1,forward,1410,0.1,10
1,backward,1410,0.2,20
2,forward,1410,0.1,10
2,backward,1410,0.2,20
"""


def test_measured_transfers_become_the_profiles_communication() -> None:
    measured = parse_profile_csv(CSV)
    previous = measured.with_communication(
        Communication(
            {(0, "forward"): Transfer(0.001, power=90.0), (1, "backward"): Transfer(0.004)},
            {2: (Phase("optimizer", 0.01),)},
        )
    )
    s = TransferSamples()
    s.add(1410, {(0, "forward"): 0.003, (5, "forward"): 0.1})  # boundary 5: not this model's
    out = with_measured_transfers(measured, fit_transfers(s), previous)
    comm = out.communication
    assert comm.transfers[(0, "forward")] == Transfer(0.003, power=90.0)  # measured, power kept
    assert comm.transfers[(1, "backward")] == Transfer(0.004)  # not measured: kept
    assert set(comm.transfers) == {(0, "forward"), (1, "backward")}
    assert comm.phases == {2: (Phase("optimizer", 0.01),)}
    # The CSV the server stores carries them.
    again = parse_profile_csv(out.to_csv())
    assert again.communication == comm


def test_two_ends_give_per_microbatch_the_smaller_time() -> None:
    c = LinkCombiner()
    # Before the second end reports, the first end's iteration is taken alone.
    assert c.add("L", "sender", 4, [(0, 0.0025)]) == [0.0025]
    assert c.add("L", "receiver", 4, [(0, 0.002)]) == []  # iteration 4 is done
    # The sender waited for its receiver on microbatch 0, the receiver for its sender on 1.
    assert c.add("L", "sender", 5, [(0, 0.009), (1, 0.002), (2, 0.0021)]) == []  # wait for both
    assert c.add("L", "receiver", 5, [(0, 0.002), (1, 0.007), (2, 0.0025)]) == [0.002]
    # One end ahead: its iterations wait for the other end, then come out in order.
    assert c.add("L", "sender", 6, [(0, 0.003)]) == []
    assert c.add("L", "sender", 7, [(0, 0.004)]) == []
    assert c.add("L", "receiver", 6, [(0, 0.0031)]) == [0.003]
    assert c.add("L", "receiver", 7, [(0, 0.005)]) == [0.004]


def test_a_silent_end_is_not_waited_for() -> None:
    c = LinkCombiner()
    assert c.add("L", "sender", 1, [(0, 0.002), (1, 0.004)]) == [pytest.approx(0.003)]
    assert c.add("L", "receiver", 1, [(0, 0.002)]) == []
    got = []
    for it in range(2, 2 + STALE_ITERATIONS + 2):
        got += c.add("L", "sender", it, [(0, 0.001)])
    # The receiver fell silent: the sender's iterations wait, then are taken once it is stale.
    assert len(got) == STALE_ITERATIONS + 2 and set(got) == {0.001}
    assert c.add("L", "sender", 99, [(0, 0.006)]) == [0.006]


def test_two_clocks_far_apart_are_not_a_trend() -> None:
    """Two clocks whose medians differ far beyond the noise still give one time.

    The trend test needs three clocks with :data:`MIN_PER_CLOCK` reports each: two medians
    always lie on a line, so with two a step in time (the host's load changed between them)
    would be read as the clock's. A clock with fewer reports does not make the third.
    """
    per_clock = {
        1410: [0.0010, 0.00101, 0.00099, 0.0010],
        1005: [0.0040, 0.00401, 0.00399, 0.0040],
    }
    assert clock_dependence(per_clock) > 100 * DEPENDENCE_Z  # test 1 alone would accept
    assert not clock_dependent(per_clock)
    assert not clock_dependent({**per_clock, 800: [0.0055] * (MIN_PER_CLOCK - 1)})
    s = TransferSamples()
    for f, v in per_clock.items():
        for t in v:
            s.add(f, {(0, "forward"): t})
    [fit] = fit_transfers(s).values()
    assert fit.times_by_clock is None
    assert fit.time == pytest.approx(median([t for v in per_clock.values() for t in v]))
    # The same data with a third clock on the line is a trend: the refusal above is the count.
    s3 = {**per_clock, 1200: [0.002556, 0.002557, 0.002555]}
    assert clock_dependent(s3)
