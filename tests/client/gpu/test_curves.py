"""``perseus_client.gpu.curves``: the profile as the simulated GPU reads it, and its curves."""

from __future__ import annotations

from pathlib import Path

import pytest
from client_data import PROFILE, PROFILE_CSV

from perseus_client import ConfigError, read_profile_csv
from perseus_client.gpu.curves import Curve, profile_measurements


def test_a_profile_reads_from_a_path_or_from_its_text(tmp_path: Path) -> None:
    path = tmp_path / "profile.csv"
    path.write_text(PROFILE_CSV)
    assert read_profile_csv(path) == PROFILE
    assert read_profile_csv(str(path)) == PROFILE
    assert read_profile_csv(PROFILE_CSV) == PROFILE  # text: it holds a newline
    only = read_profile_csv(PROFILE_CSV, stages=[1])
    assert sorted(only) == [(1, "backward"), (1, "forward")]


def test_profile_csv_errors_name_the_row(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("stage,instruction,frequency,time,energy\n0,forward,1410,-1,3\n")
    with pytest.raises(ConfigError, match="row 2: time"):
        read_profile_csv(bad)
    bad.write_text("stage,instruction,time,energy\n")
    with pytest.raises(ConfigError, match="frequency"):
        read_profile_csv(bad)


def test_a_curve_is_measured_interpolated_or_its_nearest_end() -> None:
    curve = Curve({1410: (0.010, 3.0), 1000: (0.015, 2.4), 1200: (0.012, 2.6)})
    assert curve.freqs == [1000, 1200, 1410]  # sorted, whatever the input's order
    assert curve.at(1200) == (0.012, 2.6)
    t, e = curve.at(1100)  # half way
    assert t == pytest.approx(0.0135) and e == pytest.approx(2.5)
    assert curve.at(900) == (0.015, 2.4)  # below the lowest: the lowest's
    assert curve.at(1500) == (0.010, 3.0)  # above the highest: the highest's
    assert curve.at(1100) == (t, e)  # cached, the same


def test_a_loaded_profile_gives_the_stages_asked() -> None:
    class Entry:
        def __init__(self, points: dict[int, tuple[float, float]]) -> None:
            self.frequencies = list(points)
            self.times = [t for t, _ in points.values()]
            self.energies = [e for _, e in points.values()]

    class Loaded:
        entries = {key: Entry(dict(points)) for key, points in PROFILE.items()}

    data = profile_measurements(Loaded(), [0])
    assert data == {k: v for k, v in PROFILE.items() if k[0] == 0}
    with pytest.raises(ConfigError, match=r"no data for stage\(s\) \[5\]"):
        profile_measurements(Loaded(), [5])
