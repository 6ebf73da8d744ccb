"""``perseus demo``'s command (``perseus_demo.cli``): its exit statuses and what it prints.

A run that cannot start exits 2 naming the option; a whole run (exit 0 or 1 with the JSON) is
``tests/demo/test_demo.py``'s fixture.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from perseus_demo import main as demo_main


def test_bad_options_name_the_option(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for argv, name in (
        (["--stages", "9"], "--stages"),
        (["--pipelines", "1"], "--pipelines"),
        (["--iterations", "3"], "--iterations"),
        (["--straggler", "0"], "--straggler"),
        (["--power-fraction", "0.1"], "--power-fraction"),
        (["--power-fraction", "nan"], "--power-fraction"),
        (["--profile", str(tmp_path / "missing.csv")], "--profile"),
    ):
        assert demo_main([*argv, "--output", str(tmp_path)]) == 2
        assert name in capsys.readouterr().err
