"""How the cluster budget is split between tenants (:func:`tenant_shares.split`).

Guarantees first, then what lets every tenant run, then by weight; and, over many random cases, that
no tenant ever gets less than it is guaranteed and the parts never exceed the budget.
"""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from perseus_server.service.tenant_shares import TenantDemand, split


def _d(t: str, low: float, high: float, weight: float = 1.0, g: float = 0.0) -> TenantDemand:
    return TenantDemand(t, weight, g, low, high)


def test_the_starvation_case_a_guarantee_holds_whatever_the_other_claims() -> None:
    a = _d("a", 400.0, 765.8, g=800.0)
    b = _d("b", 425_000.0, 700_000.0)  # a 1,024-pipeline job
    parts = split(1500.0, [a, b])
    assert parts["a"] == 765.8  # all it can use: its fastest plans
    assert math.isclose(parts["b"], 1500.0 - 765.8)
    # Without a guarantee, equal weights: half each.
    parts = split(1500.0, [_d("a", 400.0, 765.8), b])
    assert parts == {"a": 750.0, "b": 750.0}


def test_every_tenant_runs_when_it_can_then_weights_share_the_rest() -> None:
    # b needs 900 W to run at all: it gets it (a still gets its 300 W guarantee and more).
    parts = split(1500.0, [_d("a", 500.0, 800.0, g=300.0), _d("b", 900.0, 1000.0)])
    assert parts["b"] >= 900.0 and parts["a"] >= 500.0
    assert math.isclose(sum(parts.values()), 1500.0)
    # Weights 3:1 over what is left above the lows.
    parts = split(1000.0, [_d("a", 0.0, 10_000.0, weight=3.0), _d("b", 0.0, 10_000.0)])
    assert math.isclose(parts["a"], 750.0) and math.isclose(parts["b"], 250.0)
    # What one cannot use goes to the other.
    parts = split(1000.0, [_d("a", 0.0, 100.0, weight=3.0), _d("b", 0.0, 10_000.0)])
    assert math.isclose(parts["a"], 100.0) and math.isclose(parts["b"], 900.0)


def test_guarantees_above_the_budget_are_scaled_down_in_proportion() -> None:
    parts = split(1000.0, [_d("a", 0, 5000, g=1500.0), _d("b", 0, 5000, g=500.0)])
    assert math.isclose(parts["a"], 750.0) and math.isclose(parts["b"], 250.0)


_demand = st.tuples(
    st.floats(0, 5000),  # low
    st.floats(0, 5000),  # extra above low
    st.floats(0.1, 10),  # weight
    st.floats(0, 3000),  # guaranteed
)


@settings(max_examples=300, deadline=None)
@given(st.floats(1, 20_000), st.lists(_demand, min_size=1, max_size=6))
def test_no_tenant_is_pushed_below_its_guarantee(watts: float, rows: list) -> None:
    demands = [_d(f"t{i}", lo, lo + ex, w, g) for i, (lo, ex, w, g) in enumerate(rows)]
    parts = split(watts, demands)
    assert set(parts) == {d.tenant for d in demands}
    assert math.fsum(parts.values()) <= watts * (1 + 1e-9) + 1e-6
    owed = {d.tenant: min(d.guaranteed, d.high) for d in demands}
    scale = min(1.0, watts / math.fsum(owed.values())) if sum(owed.values()) > 0 else 1.0
    for d in demands:
        assert parts[d.tenant] >= owed[d.tenant] * scale * (1 - 1e-9) - 1e-6, d
        assert parts[d.tenant] <= max(d.high, owed[d.tenant]) * (1 + 1e-9) + 1e-6, d
    # Nothing is left over while a tenant could use more.
    if any(parts[d.tenant] < d.high - 1e-6 for d in demands):
        assert math.isclose(math.fsum(parts.values()), watts, rel_tol=1e-9, abs_tol=1e-6)
