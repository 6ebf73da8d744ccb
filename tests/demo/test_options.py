"""The demo's options (``perseus_demo.options``): the parser, its defaults and the checks."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from perseus_demo import DemoError, DemoOptions
from perseus_demo.options import check_options, parse_options


def test_the_parser_defaults_are_the_options_defaults() -> None:
    assert parse_options([]) == DemoOptions()
    opts = parse_options(["--stages", "3", "--profile", "p.csv", "--json"])
    assert (opts.stages, opts.profile, opts.json, opts.world) == (3, Path("p.csv"), True, 6)


def test_each_check_names_its_option_and_the_edges_pass() -> None:
    """:func:`check_options` raises :class:`DemoError` naming the first option out of range."""
    profile_stages = 8
    check_options(DemoOptions(), profile_stages)  # the defaults run
    edges = DemoOptions(stages=8, pipelines=4, microbatches=8, iterations=8, straggler=3.0,
                        time_scale=0.01, power_fraction=0.3)  # fmt: skip
    check_options(edges, profile_stages)  # every bound is inclusive
    for bad, name in (
        (DemoOptions(stages=9), "--stages: must be between 1 and 8"),
        (DemoOptions(stages=1, microbatches=1), "--stages: a pipeline needs at least 2"),
        (DemoOptions(stages=8, pipelines=5, microbatches=8), "--stages: stages x pipelines"),
        (DemoOptions(pipelines=9), "--pipelines"),
        (DemoOptions(microbatches=3), "--microbatches: must be between --stages (4) and 64"),
        (DemoOptions(iterations=7), "--iterations"),
        (DemoOptions(straggler=-0.1), "--straggler"),
        (DemoOptions(time_scale=200.0), "--time-scale"),
        (DemoOptions(power_fraction=1.01), "--power-fraction"),
        (DemoOptions(power_fraction=float("nan")), "--power-fraction"),
    ):
        with pytest.raises(DemoError, match=re.escape(name)):
            check_options(bad, profile_stages)
