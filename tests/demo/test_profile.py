"""The demo's profile (``perseus_demo.profile``): the shipped samples, slicing, blocking power."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from perseus.cli import _blocking_power_for as cli_blocking_power
from perseus_common.gpus import KNOWN_GPUS
from perseus_demo import DemoError
from perseus_demo.profile import (
    DEFAULT_PROFILE,
    blocking_power_for,
    profile_path,
    sample_profile,
    slice_profile,
)

ROOT = Path(__file__).resolve().parents[2]


def test_the_default_profile_is_the_shipped_sample() -> None:
    """The sample profiles are package data (a link to ``profiles/``), found through importlib.

    They are found through importlib.resources rather than a path relative to the checkout.
    """
    source = ROOT / "profiles" / DEFAULT_PROFILE
    assert sample_profile().read_bytes() == source.read_bytes()
    assert sample_profile("gpt3-175b_a40_8stage.csv").is_file()
    with profile_path(None) as path:
        assert path.name == DEFAULT_PROFILE and path.read_bytes() == source.read_bytes()
    with pytest.raises(DemoError, match="--profile"), profile_path(ROOT / "missing.csv"):
        pass


#: Profile names and the GPU (key) whose blocking power they get; ``None``: none is known.
PROFILE_NAMES = {
    "gpt3-175b_a100-sxm_8stage.csv": "a100",
    "gpt3-175b_a40_8stage.csv": "a40",
    "gpt3_a100-sxm.csv": "a100",
    "A100.csv": "a100",
    "bert_a40.csv": "a40",
    "a40_vs_a100.csv": None,  # both named: ambiguous, the user must say
    "ma400.csv": None,  # "a40" inside a word is no GPU
    "a400.csv": None,
    "a1000.csv": None,
    "xa100.csv": None,
    "h100.csv": None,
    "profile.csv": None,
}


@pytest.mark.parametrize(("name", "key"), sorted(PROFILE_NAMES.items()))
def test_the_demo_and_the_cli_agree_on_blocking_power(
    name: str, key: str | None, capsys: pytest.CaptureFixture[str]
) -> None:
    """Both look the GPU up in perseus_common.gpus.

    They once had two tables and two lookups that disagreed.
    """
    try:
        demo: float | None = blocking_power_for(name, None)
    except DemoError as e:
        assert "--blocking-power" in str(e)
        demo = None
    try:
        cli: float | None = cli_blocking_power(Path(name), None)
    except SystemExit as e:
        assert "--blocking-power is required" in str(e)
        cli = None
    expected = next((g.blocking_power for g in KNOWN_GPUS if g.key == key), None)
    assert key is None or expected is not None
    assert demo == cli == expected
    if key is not None:
        assert key.upper() in capsys.readouterr().err  # the CLI says which GPU it assumed
    # A given power wins over the name, in both.
    assert blocking_power_for(name, 50.0) == cli_blocking_power(Path(name), 50.0) == 50.0


@pytest.mark.slow
def test_an_installed_wheel_ships_the_sample_profiles(tmp_path: Path, project_wheel: Path) -> None:
    """Built as a (non-editable) wheel, the demo finds its default profile without the checkout."""
    import zipfile

    wheel = project_wheel
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        z.extractall(tmp_path / "site")
    shipped = {p.name for p in (ROOT / "profiles").iterdir()}
    assert {f"perseus_demo/profiles/{n}" for n in shipped} <= names
    assert "perseus_demo/rank.py" in names and "perseus/demo.py" not in names
    probe = (
        "import perseus_demo, perseus_demo.profile as p\n"
        "with p.profile_path(None) as path:\n"
        "    print(perseus_demo.__file__, path, p.blocking_power_for(path.name, None))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
        cwd=tmp_path, env={"PYTHONPATH": str(tmp_path / "site"), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    init, path, power = out.stdout.split()
    assert Path(init).is_relative_to(tmp_path / "site")
    assert Path(path).read_bytes() == (ROOT / "profiles" / DEFAULT_PROFILE).read_bytes()
    assert float(power) == next(g.blocking_power for g in KNOWN_GPUS if g.key == "a100")


def test_a_slice_is_the_profiles_first_stages_and_says_how_many_it_has() -> None:
    from perseus.profiles import parse_profile_csv

    path = ROOT / "profiles" / DEFAULT_PROFILE
    text, stages = slice_profile(path, 3)
    assert stages == 8
    sliced = parse_profile_csv(text)
    assert sliced.stages == 3
    whole = parse_profile_csv(path.read_text())
    assert sliced.to_csv() == whole.select_stages(range(3)).to_csv()
    # more stages than the profile has: all of them (check_options names the option)
    assert (
        slice_profile(path, 12)[1] == 8
        and parse_profile_csv(slice_profile(path, 12)[0]).stages == 8
    )
    with pytest.raises(DemoError, match="--blocking-power: must be >= 0"):
        blocking_power_for(DEFAULT_PROFILE, -1.0)
