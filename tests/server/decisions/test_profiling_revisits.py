"""Which clocks the scan measures again: close effective costs (plan-aware revisits)."""

from __future__ import annotations

import numpy as np

from perseus_server.decisions.profiling_revisits import Curve, cost_needs, next_revisit, time_needs
from perseus_server.decisions.profiling_scan import Measurement, ProfilingSession

FREQS = np.array([1500, 1450, 1400, 1350, 1300, 1250], dtype=np.int64)


def _curve(times: list[float], costs: list[float], cost_se: float) -> Curve:
    t, c = np.array(times), np.array(costs)
    return Curve(FREQS, t, np.full(6, 1e-6), c + 0.1, c, np.full(6, cost_se))


def test_only_clocks_some_price_makes_competitive_are_needed() -> None:
    # Time rises as the clock falls; the cost falls to a valley at 1350 MHz, and 1300 MHz is
    # within the noise of it (a close choice); 1250 MHz is far past the valley. 1450 MHz lies
    # far above the segment from 1500 to 1400 MHz: no price makes it competitive.
    times = [1.00, 1.01, 1.02, 1.04, 1.06, 1.10]
    costs = [10.0, 9.99, 9.5, 9.0, 9.002, 9.8]
    need = cost_needs(_curve(times, costs, 0.002), sigmas=3.0, cost_tolerance=1e-4)
    assert 1450 not in need and 1250 not in need
    assert need & {1350, 1300}
    # Told apart (errors below the tolerance) or no noise estimate: nothing is needed.
    assert not cost_needs(_curve(times, costs, 0.002), sigmas=3.0, cost_tolerance=0.01)
    assert not cost_needs(_curve(times, costs, 0.0), sigmas=3.0, cost_tolerance=1e-4)
    assert not cost_needs(_curve(times, costs, 0.002), sigmas=3.0, cost_tolerance=0.0)


def test_a_hull_vertex_close_to_its_neighbour_at_the_vertex_price_is_needed() -> None:
    # Convex; straight from 1500 to 1400 MHz: at that slope's price 1450 MHz ties with both
    # ends, though at no price it is the only cheapest.
    times = [1.00, 1.01, 1.02, 1.04, 1.06, 1.10]
    costs = [10.0, 9.8, 9.6, 9.5, 9.45, 9.9]
    need = cost_needs(_curve(times, costs, 1e-3), sigmas=3.0, cost_tolerance=1e-5)
    assert 1450 in need or {1500, 1400} <= need
    assert 1250 not in need


def test_time_needs_come_before_cost_needs() -> None:
    times = [1.00, 1.0005, 1.02, 1.04, 1.06, 1.10]
    costs = [10.0, 9.99, 9.5, 9.0, 9.002, 9.8]
    c = _curve(times, costs, 0.002)
    timed = Curve(c.frequencies, c.time, np.full(6, 0.002), c.energy, c.cost, c.cost_se)
    assert time_needs(timed, sigmas=3.0, top_tolerance=0.001) <= {1500, 1450}
    got = next_revisit([timed], sigmas=3.0, top_tolerance=0.001, cost_tolerance=1e-4)
    assert got in {1500, 1450}
    assert next_revisit([c], sigmas=3.0, top_tolerance=0.0, cost_tolerance=0.0) is None


def test_a_session_measures_close_valley_clocks_again_only_with_a_cost_tolerance() -> None:
    freqs = [1500, 1450, 1400, 1350, 1300, 1250, 1200]
    # exact times (no time needs); energies convex down to a valley at 1350 MHz that 1300 MHz
    # ties within the noise; every other clock is told apart
    times = {f: 0.10 + 0.01 * i for i, f in enumerate(freqs)}
    energies = dict(zip(freqs, [12.0, 11.0, 10.4, 10.0, 10.002, 11.0, 12.0], strict=True))

    def scan(cost_tolerance: float) -> ProfilingSession:
        s = ProfilingSession(
            freqs,
            0,
            2,
            3,
            tolerance=0.01,
            max_revisits=3,
            smooth=False,
            cost_tolerance=cost_tolerance,
        )
        for version in range(1, 50):
            s.step_version = version
            f = s.frequency
            while not s.step_complete({"r0"}, 1):
                ms = [
                    Measurement("forward", 0, f, times[f], energies[f] * (1 + 0.003 * (-1) ** i))
                    for i in range(4)
                ]
                s.record("r0", version, 0.0, ms)
            if s.advance():
                return s
        raise AssertionError("the scan never stopped")

    assert not scan(0.0).revisited
    s = scan(1e-4)
    assert s.revisited and set(s.revisited) <= {1350, 1300}
    assert len(s.revisited) <= 3 and s.iterations_spent == 7 + 2 * len(s.revisited)
    again = ProfilingSession.from_json(s.to_json())
    assert again.cost_tolerance == s.cost_tolerance
