"""The options of ``perseus demo``: its command line and the checks on what it was given."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from perseus_demo.errors import DemoError

__all__ = ["DemoOptions", "build_parser", "parse_options", "check_options"]


@dataclass(frozen=True)
class DemoOptions:
    """What one run of the demo does.

    Attributes:
        profile: the profile CSV; ``None`` for the sample profile shipped with the demo.
        stages: pipeline stages (the profile's first ``stages``).
        pipelines: data-parallel pipelines; pipeline 1 becomes the straggler.
        microbatches: microbatches per step.
        iterations: steps per phase.
        straggler: the slowdown injected into pipeline 1 in phase 3 (0.2 = 20 % slower).
        time_scale: wall seconds per profiled second.
        blocking_power: watts a waiting GPU draws; ``None`` to look it up by the profile's name.
        output: the directory the results, plot and logs go to.
        json: print the results as JSON on stdout instead of the report.
        timeout: seconds after which the ranks are given up on.
        power_fraction: phase 5's power budget, as a fraction of the job's max-clock average
            power (``pipelines x E0 / T0``).
    """

    profile: Path | None = None
    stages: int = 4
    pipelines: int = 2
    microbatches: int = 6
    iterations: int = 10
    straggler: float = 0.2
    time_scale: float = 0.75
    blocking_power: float | None = None
    output: Path = Path("perseus-demo")
    json: bool = False
    timeout: float = 600.0
    power_fraction: float = 0.85

    @property
    def world(self) -> int:
        """How many rank processes the demo starts."""
        return self.stages * self.pipelines


def build_parser() -> argparse.ArgumentParser:
    """The ``perseus demo`` argument parser; its defaults are :class:`DemoOptions`'s."""
    d = DemoOptions()
    p = argparse.ArgumentParser(
        prog="perseus demo",
        description="Run Perseus end to end on this machine: a real server, real torch pipeline "
        "ranks over gloo, simulated GPUs, and a straggler.",
    )
    p.add_argument(
        "--profile",
        type=Path,
        default=d.profile,
        help="profile CSV (default: the shipped GPT-3 175B profile on A100 SXM)",
    )
    p.add_argument("--stages", type=int, default=d.stages, help="pipeline stages (default 4)")
    p.add_argument(
        "--pipelines", type=int, default=d.pipelines, help="data-parallel pipelines (default 2)"
    )
    p.add_argument(
        "--microbatches", type=int, default=d.microbatches, help="microbatches per step (default 6)"
    )
    p.add_argument(
        "--iterations",
        type=int,
        default=d.iterations,
        help="steps per phase (default 10, at least 8)",
    )
    p.add_argument(
        "--straggler",
        type=float,
        default=d.straggler,
        help="slowdown injected into pipeline 1 in phase 3 (default 0.2 = 20%%)",
    )
    p.add_argument(
        "--time-scale",
        type=float,
        default=d.time_scale,
        help="wall seconds per profiled second (default 0.75)",
    )
    p.add_argument("--blocking-power", type=float, help="watts a waiting GPU draws")
    p.add_argument("--output", "-o", type=Path, default=d.output, help="output directory")
    p.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    p.add_argument(
        "--timeout", type=float, default=d.timeout, help="give up after this many seconds"
    )
    p.add_argument(
        "--power-fraction",
        type=float,
        default=d.power_fraction,
        help="phase 5's power budget as a fraction of the max-clock average power (default 0.85)",
    )
    return p


def parse_options(argv: list[str] | None = None) -> DemoOptions:
    """The options of a command line (``None``: ``sys.argv``); exits on a malformed one."""
    a = build_parser().parse_args(argv)
    return DemoOptions(
        profile=a.profile,
        stages=a.stages,
        pipelines=a.pipelines,
        microbatches=a.microbatches,
        iterations=a.iterations,
        straggler=a.straggler,
        time_scale=a.time_scale,
        blocking_power=a.blocking_power,
        output=a.output,
        json=a.json,
        timeout=a.timeout,
        power_fraction=a.power_fraction,
    )


def check_options(opts: DemoOptions, profile_stages: int) -> None:
    """Raise :class:`DemoError` naming the first option out of range.

    The profile has ``profile_stages`` stages.
    """

    def bad(name: str, why: str) -> None:
        raise DemoError(f"--{name}: {why}")

    if not (1 <= opts.stages <= profile_stages):
        bad("stages", f"must be between 1 and {profile_stages} (the profile's stages)")
    if opts.stages < 2:
        bad("stages", "a pipeline needs at least 2 stages")
    if not (2 <= opts.pipelines <= 8):
        bad("pipelines", "must be between 2 and 8 (pipeline 1 becomes the straggler)")
    if opts.world > 32:
        bad("stages", "stages x pipelines must be at most 32 rank processes")
    if not (opts.stages <= opts.microbatches <= 64):
        bad("microbatches", f"must be between --stages ({opts.stages}) and 64")
    if not (8 <= opts.iterations <= 1000):
        bad("iterations", "must be between 8 and 1000")
    if not (0.0 < opts.straggler <= 3.0):
        bad("straggler", "must be a slowdown in (0, 3], e.g. 0.2")
    if not (0.01 <= opts.time_scale <= 100):
        bad("time-scale", "must be between 0.01 and 100")
    if not (0.3 <= opts.power_fraction <= 1.0):
        bad("power-fraction", "must be between 0.3 and 1, e.g. 0.85")
