"""Prometheus text-format series: counters, gauges and histograms with labels, and a registry.

The parts :mod:`perseus_server.metrics` builds the server's metrics from. Label values a caller
chooses (an HTTP method, a route, a gRPC method) must not grow the series without bound: a
counter or histogram can be :meth:`~Counter.restrict`-ed to a set of values per label, the
server's own; any other value is counted as :data:`OTHER`.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable, Sequence

__all__ = [
    "HTTP_METHODS",
    "OTHER",
    "Counter",
    "Gauge",
    "Histogram",
    "Labels",
    "Registry",
    "solve_buckets",
]

Labels = tuple[tuple[str, str], ...]

#: The label value of everything outside a restricted label's set.
OTHER = "other"
#: The HTTP methods request metrics name; any other method is counted as :data:`OTHER`.
HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"})


class _Restricted:
    """Label keys built from values folded into each label's allowed set (if it has one)."""

    def __init__(self) -> None:
        self.allowed: dict[str, frozenset[str]] = {}

    def restrict(self, **allowed: Iterable[str]) -> None:
        """From now on, a value of label ``k`` outside ``allowed[k]`` is counted as ``other``."""
        for k, values in allowed.items():
            self.allowed[k] = frozenset(values)

    def _key(self, labels: dict[str, str]) -> Labels:
        if self.allowed:
            for k, values in self.allowed.items():
                if k in labels and labels[k] not in values:
                    labels[k] = OTHER
        return tuple(sorted(labels.items()))


#: The solve-time buckets below the longest a solve may take (s).
_SOLVE_BUCKETS = (0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 2700, 3600)


def solve_buckets(limit: float) -> tuple[float, ...]:
    """``perseus_solve_seconds`` buckets: the standard ones below ``limit``, then ``limit`` itself.

    ``limit`` is the solve time limit, so every solve that ran to its limit has a bucket.
    """
    return tuple(b for b in _SOLVE_BUCKETS if b < limit) + (float(limit),)


def _fmt_labels(labels: Labels, extra: Labels = ()) -> str:
    items = labels + extra
    if not items:
        return ""
    esc = [
        f'{k}="{str(v).replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34)).replace(chr(10), " ")}"'
        for k, v in items
    ]
    return "{" + ",".join(esc) + "}"


def _fmt_value(v: float) -> str:
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v)) if not float(v).is_integer() else str(int(v))


class Counter(_Restricted):
    """A monotonically increasing value per label set."""

    kind = "counter"

    def __init__(self, name: str, help: str) -> None:
        super().__init__()
        self.name, self.help = name, help
        self.values: dict[Labels, float] = {}

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        """Add ``amount`` to the series of ``labels``."""
        key = self._key(labels)
        self.values[key] = self.values.get(key, 0.0) + amount

    def drop(self, **labels: str) -> None:
        """Forget every series whose labels include ``labels`` (``O(series)``)."""
        want = set(labels.items())
        for key in [k for k in self.values if want <= set(k)]:
            del self.values[key]

    def render(self) -> list[str]:
        """The counter's sample lines, by labels."""
        return [
            f"{self.name}{_fmt_labels(k)} {_fmt_value(v)}" for k, v in sorted(self.values.items())
        ]


class Gauge:
    """A value that goes up and down; either set explicitly or read from a callback."""

    kind = "gauge"

    def __init__(
        self, name: str, help: str, read: Callable[[], dict[Labels, float]] | None = None
    ) -> None:
        self.name, self.help, self._read = name, help, read
        self.values: dict[Labels, float] = {}

    def set(self, value: float, **labels: str) -> None:
        """Set the series of ``labels`` to ``value``."""
        self.values[tuple(sorted(labels.items()))] = value

    def render(self) -> list[str]:
        """The gauge's sample lines, by labels (read from its source when it has one)."""
        values = self._read() if self._read is not None else self.values
        return [f"{self.name}{_fmt_labels(k)} {_fmt_value(v)}" for k, v in sorted(values.items())]


class Histogram(_Restricted):
    """Cumulative buckets, sum and count per label set."""

    kind = "histogram"

    def __init__(self, name: str, help: str, buckets: Sequence[float]) -> None:
        super().__init__()
        self.name, self.help = name, help
        self.buckets = sorted(buckets)
        self.series: dict[Labels, list[float]] = {}  # per label set: bucket counts..., sum, count

    def observe(self, value: float, **labels: str) -> None:
        """Count ``value`` in the series of ``labels``."""
        key = self._key(labels)
        s = self.series.get(key)
        if s is None:
            s = self.series[key] = [0.0] * (len(self.buckets) + 2)
        i = bisect.bisect_left(self.buckets, value)
        if i < len(self.buckets):
            s[i] += 1
        s[-2] += value
        s[-1] += 1

    def render(self) -> list[str]:
        """The histogram's sample lines: cumulative buckets, sum and count per series."""
        out = []
        for key, s in sorted(self.series.items()):
            acc = 0.0
            for b, c in zip(self.buckets, s[: len(self.buckets)], strict=True):
                acc += c
                out.append(
                    f"{self.name}_bucket{_fmt_labels(key, (('le', _fmt_value(b)),))} {_fmt_value(acc)}"
                )
            out.append(
                f"{self.name}_bucket{_fmt_labels(key, (('le', '+Inf'),))} {_fmt_value(s[-1])}"
            )
            out.append(f"{self.name}_sum{_fmt_labels(key)} {_fmt_value(s[-2])}")
            out.append(f"{self.name}_count{_fmt_labels(key)} {_fmt_value(s[-1])}")
        return out


class Registry:
    """An ordered set of metrics rendered together."""

    def __init__(self) -> None:
        self._metrics: list[Counter | Gauge | Histogram] = []

    def add(self, metric: Counter | Gauge | Histogram) -> Counter | Gauge | Histogram:
        """Add ``metric`` to the registry; returns it."""
        self._metrics.append(metric)
        return metric

    def render(self) -> str:
        """Every metric in the Prometheus text format, with its help and type."""
        lines = []
        for m in self._metrics:
            lines.append(f"# HELP {m.name} {m.help}")
            lines.append(f"# TYPE {m.name} {m.kind}")
            lines.extend(m.render())
        return "\n".join(lines) + "\n"
