"""``metric_series.py``: Prometheus text-format counters, gauges, histograms and their registry.

What a registry renders is read back by Prometheus's own text parser (``prometheus_client``), and
a restricted label folds every value outside its set into ``other``.
"""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from perseus_server.metric_series import Counter, Gauge, Histogram, Registry, solve_buckets


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_a_registry_renders_what_prometheus_reads_back() -> None:
    reg = Registry()
    c = reg.add(Counter("perseus_x_total", "Things."))
    g = reg.add(Gauge("perseus_jobs", "Jobs.", read=lambda: {(("state", "running"),): 3.0}))
    h = reg.add(Histogram("perseus_latency_seconds", "Latency.", buckets=[0.1, 1.0]))
    assert isinstance(c, Counter) and isinstance(h, Histogram) and isinstance(g, Gauge)
    c.inc(route='/a"b\\c\nd')  # quotes, backslashes and newlines escaped
    c.inc(2.5, route="/x")
    for v in (0.05, 0.5, 7.0):
        h.observe(v, method="GET")
    text = reg.render()
    assert "# TYPE perseus_latency_seconds histogram" in text
    got = _samples(text)
    assert got[("perseus_x_total", (("route", '/a"b\\c d'),))] == 1.0
    assert got[("perseus_x_total", (("route", "/x"),))] == 2.5
    assert got[("perseus_jobs", (("state", "running"),))] == 3.0
    bucket = "perseus_latency_seconds_bucket"
    assert got[(bucket, (("le", "0.1"), ("method", "GET")))] == 1.0
    assert got[(bucket, (("le", "1"), ("method", "GET")))] == 2.0  # cumulative
    assert got[(bucket, (("le", "+Inf"), ("method", "GET")))] == 3.0  # 7 s beyond every bucket
    assert got[("perseus_latency_seconds_sum", (("method", "GET"),))] == pytest.approx(7.55)
    assert got[("perseus_latency_seconds_count", (("method", "GET"),))] == 3.0


def test_a_set_gauge_and_a_dropped_counter_series() -> None:
    g = Gauge("g", "g")
    g.set(4, job="a")
    g.set(5, job="a")
    assert g.render() == ['g{job="a"} 5']
    c = Counter("c_total", "c")
    c.inc(job="a", tenant="t")
    c.inc(job="b", tenant="t")
    c.drop(job="a")
    assert c.render() == ['c_total{job="b",tenant="t"} 1']


def test_a_restricted_histogram_folds_unknown_values() -> None:
    h = Histogram("h", "h", buckets=[1.0])
    h.restrict(route={"/jobs"})
    for i in range(50):
        h.observe(0.5, route=f"/invented/{i}")
    h.observe(0.5, route="/jobs")
    assert set(h.series) == {(("route", "other"),), (("route", "/jobs"),)}


def test_solve_buckets_end_at_the_time_limit() -> None:
    assert solve_buckets(45) == (0.5, 1, 2, 5, 10, 30, 45.0)
    assert solve_buckets(0.5) == (0.5,)
    assert solve_buckets(7200)[-2:] == (3600, 7200.0)


def test_restricted_counter_folds_unknown_values() -> None:
    from perseus_server.grpc.gate import method_label
    from perseus_server.metric_series import OTHER, Counter

    c = Counter("x_total", "x")
    c.restrict(method={"A", "B"})
    for i in range(100):
        c.inc(method=f"m{i}", code="OK")
    c.inc(method="A", code="OK")
    assert set(c.values) == {(("code", "OK"), ("method", OTHER)), (("code", "OK"), ("method", "A"))}
    assert method_label("/perseus.v1.PlanService/WatchPlan") == "WatchPlan"
    assert method_label("/other.PlanService/WatchPlan") == OTHER
    assert method_label("/perseus.v1.PlanService/Nope") == OTHER
