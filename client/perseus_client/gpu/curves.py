"""A profile as the simulated GPU reads it: per (stage, kind), time and energy by SM clock.

:func:`read_profile_csv` reads a ``stage,instruction,frequency,time,energy`` CSV into plain dicts
(no numpy needed), and a :class:`Curve` gives one (stage, kind)'s time and energy at any clock,
interpolated linearly between the measured ones. :class:`~perseus_client.gpu.simulated.SimulatedGpu`
is built on them.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from perseus_client.errors import ConfigError
from perseus_common import profile_csv

__all__ = ["Curve", "Measurements", "profile_measurements", "read_profile_csv"]

#: ``{(stage, kind): {frequency_mhz: (time_seconds, energy_joules)}}``
Measurements = Mapping[tuple[int, str], Mapping[int, tuple[float, float]]]


def read_profile_csv(
    source: str | Path, *, stages: Iterable[int] | None = None
) -> dict[tuple[int, str], dict[int, tuple[float, float]]]:
    """Read a ``stage,instruction,frequency,time,energy`` CSV into plain dicts.

    ``source`` is a path, or the CSV text itself when it contains a newline. Only the rows of
    ``stages`` are kept (all when ``None``). Every row is validated by the project's one profile
    reader (:mod:`perseus_common.profile_csv`); errors name the row and column.
    """
    text = source if isinstance(source, str) and "\n" in source else Path(source).read_text()
    try:
        data = profile_csv.read_csv(text, stages=stages)
    except profile_csv.ProfileFormatError as exc:
        where = f"row {exc.row}: " if exc.row is not None else ""
        what = f"{exc.field} " if exc.field is not None else ""
        raise ConfigError("profile", f"{where}{what}{exc.detail}") from None
    return {key: {f: (t, e) for f, t, e in opts} for key, opts in data.items()}


class Curve:
    """Time and energy of one (stage, kind) as functions of frequency (linear interpolation)."""

    __slots__ = ("freqs", "times", "energies", "_cache")

    def __init__(self, points: Mapping[int, tuple[float, float]]) -> None:
        items = sorted((int(f), float(t), float(e)) for f, (t, e) in points.items())
        self.freqs = [f for f, _, _ in items]
        self.times = [t for _, t, _ in items]
        self.energies = [e for _, _, e in items]
        self._cache: dict[int, tuple[float, float]] = {}

    def at(self, mhz: int) -> tuple[float, float]:
        """``(seconds, joules)`` at ``mhz``: measured, interpolated, or the nearest end's."""
        hit = self._cache.get(mhz)
        if hit is not None:
            return hit
        fs = self.freqs
        i = bisect.bisect_left(fs, mhz)
        if i < len(fs) and fs[i] == mhz:
            res = (self.times[i], self.energies[i])
        elif i == 0:
            res = (self.times[0], self.energies[0])
        elif i == len(fs):
            res = (self.times[-1], self.energies[-1])
        else:
            w = (mhz - fs[i - 1]) / (fs[i] - fs[i - 1])
            res = (
                self.times[i - 1] + w * (self.times[i] - self.times[i - 1]),
                self.energies[i - 1] + w * (self.energies[i] - self.energies[i - 1]),
            )
        self._cache[mhz] = res
        return res


def profile_measurements(
    profile: Any, stages: Iterable[int]
) -> dict[tuple[int, str], dict[int, tuple[float, float]]]:
    """The data of ``stages`` of a :class:`perseus.profiles.Profile` (duck-typed: ``entries``)."""
    wanted = set(stages)
    data: dict[tuple[int, str], dict[int, tuple[float, float]]] = {}
    for (s, k), p in profile.entries.items():
        if s in wanted:
            data[(int(s), str(k))] = {
                int(f): (float(t), float(e))
                for f, t, e in zip(p.frequencies, p.times, p.energies, strict=True)
            }
    if not data:
        raise ConfigError("stage", f"the profile has no data for stage(s) {sorted(wanted)}")
    return data
