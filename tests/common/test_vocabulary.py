"""The shared profile reader, as the core and the client use it: the same data, the same refusals.

The GPU table is ``test_gpus.py``'s, the kinds ``test_kinds.py``'s.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from perseus.errors import ProfileError
from perseus.profiles import parse_profile_csv
from perseus_client import ConfigError, read_profile_csv
from perseus_common import profile_csv

PROFILES = Path(__file__).resolve().parents[2] / "profiles"


@pytest.mark.parametrize("path", sorted(PROFILES.glob("*.csv")), ids=lambda p: p.name)
def test_core_and_client_read_the_shipped_profiles_alike(path: Path) -> None:
    core = parse_profile_csv(path.read_text())
    client = read_profile_csv(path)
    assert set(client) == set(core.entries)
    for key, p in core.entries.items():
        assert client[key] == {
            int(f): (float(t), float(e))
            for f, t, e in zip(p.frequencies, p.times, p.energies, strict=True)
        }


BAD_ROWS = [
    ("0,forward,1410,nan,3", "time"),
    ("0,forward,1410,0.1,-3", "energy"),
    ("0,forward,1410.5,0.1,3", "frequency"),
    ("-1,forward,1410,0.1,3", "stage"),
    ("0,sideways,1410,0.1,3", "instruction"),
    ("0,forward,1410,0.1,3\n0,forward,1410,0.2,4", "frequency"),
]


@pytest.mark.parametrize(("rows", "field"), BAD_ROWS)
def test_core_and_client_refuse_the_same_rows_naming_the_field(rows: str, field: str) -> None:
    text = "stage,instruction,frequency,time,energy\n" + rows + "\n"
    with pytest.raises(profile_csv.ProfileFormatError) as shared:
        profile_csv.read_csv(text)
    assert shared.value.field == field and shared.value.row is not None
    with pytest.raises(ProfileError) as core:
        parse_profile_csv(text)
    assert core.value.field == field and core.value.row == shared.value.row
    with pytest.raises(ConfigError, match=f"row {shared.value.row}: {field}"):
        read_profile_csv(text)


def test_the_client_reads_some_stages_of_a_profile_the_core_needs_whole() -> None:
    text = "stage,instruction,frequency,time,energy\n3,forward,1410,0.1,3\n3,backward,1410,0.2,6\n"
    assert read_profile_csv(text, stages=[3]) == {
        (3, "forward"): {1410: (0.1, 3.0)},
        (3, "backward"): {1410: (0.2, 6.0)},
    }
    with pytest.raises(ProfileError, match="stage"):
        parse_profile_csv(text)
