"""The ``perseus`` command.

Its own subcommands: ``frontier``, ``plot``, and ``--version``. The applications add theirs
(``serve`` and ``db``: the server; ``demo``; ``gpud``: the node daemon) as entry points that
this command discovers (:mod:`perseus.app_commands`), so the core imports none of them. ``gpud``
and ``--version`` work on a plain (rank-client) install.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["main", "version"]


def version() -> str:
    """The installed distribution's version, or ``0+unknown`` when it is not installed."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("perseus")
    except PackageNotFoundError:
        return "0+unknown"


def _blocking_power_for(profile: Path, given: float | None) -> float:
    from perseus_common.gpus import known_gpu_for

    if given is not None:
        return given
    gpu = known_gpu_for(profile.name)
    if gpu is not None:
        print(
            f"perseus: using the measured blocking power of the {gpu.key.upper()}: "
            f"{gpu.blocking_power} W",
            file=sys.stderr,
        )
        return gpu.blocking_power
    raise SystemExit(
        "perseus frontier: --blocking-power is required (watts a GPU draws while waiting)"
    )


class _Progress:
    """A one-line progress bar on a terminal; silent otherwise."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.start = time.perf_counter()
        self.last = -1

    def __call__(self, fraction: float) -> None:
        if not self.enabled:
            return
        pct = int(fraction * 100)
        if pct == self.last:
            return
        self.last = pct
        bar = "#" * (pct // 4) + "." * (25 - pct // 4)
        sys.stderr.write(f"\r[{bar}] {pct:3d}%  {time.perf_counter() - self.start:6.1f} s")
        sys.stderr.flush()

    def done(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")


def _cmd_frontier(args: argparse.Namespace) -> int:
    from perseus.errors import ProfileError
    from perseus.profiles import load_profile
    from perseus.schedules import make_schedule
    from perseus.solver import solve_frontier

    if args.power_budget is not None:
        from perseus.power.plan_power import check_budget

        check_budget(args.power_budget)  # before the solve: a bad budget fails at once
    selection = _selection(args)  # so does any other bad policy value
    if args.max_swing is not None or args.max_ramp is not None:
        from perseus.power import SwingBounds

        SwingBounds(args.max_swing, args.max_ramp, args.ramp_window)  # so do bad bounds
    profile = load_profile(args.profile)
    schedule = make_schedule(args.schedule, args.stages, args.microbatches, args.virtual_stages)
    if args.profile_stages is not None:
        from perseus.profiles import parse_stage_list

        profile = profile.select_stages(parse_stage_list(args.profile_stages))
    elif profile.stages > schedule.stages:
        raise ProfileError(
            f"the profile has {profile.stages} stages but the job {schedule.stages}; choose which "
            f"to use with --profile-stages (e.g. --profile-stages 0-{schedule.stages - 1} for its "
            f"first {schedule.stages})",
            field="stages",
        )
    power = _blocking_power_for(Path(args.profile), args.blocking_power)
    bar = _Progress(sys.stderr.isatty() and not args.quiet)
    t = time.perf_counter()
    try:
        frontier = solve_frontier(profile, schedule, power, progress=bar, effort=args.effort)
    finally:
        bar.done()
    elapsed = time.perf_counter() - t
    if args.resolution:
        frontier = frontier.thinned(args.resolution)
    doc = frontier.to_json(plans=args.plans)
    selected_line = ""
    if selection is not None:
        doc["selected"] = _selected_doc(frontier, *selection)
        s = doc["selected"]
        selected_line = (
            f"perseus: {s['policy']}: point {s['point']}, T = {s['time']:.4f} s "
            f"({100 * s['slowdown']:+.2f} % against T0), E = {s['energy']:.1f} J"
        )
    budget_line = ""
    if args.power_budget is not None:
        doc["power_budget"] = _power_budget_doc(frontier, profile, power, args.power_budget)
        b = doc["power_budget"]
        budget_line = (
            f"perseus: within {b['watts']:g} W: point {b['point']}, T = {b['time']:.4f} s "
            f"({100 * b['slowdown']:+.2f} % against T0), E = {b['energy']:.1f} J, "
            f"average power {b['average_power']:.1f} W, peak {b['peak_power']:.1f} W per GPU"
        )
    if args.power_timeline or args.max_swing is not None or args.max_ramp is not None:
        budget_line += _swing(args, frontier, profile, power, doc)
    text = json.dumps(doc, indent=1 if args.plans else 2)
    if args.output:
        Path(args.output).write_text(text + "\n")
    else:
        sys.stdout.write(text + "\n")
    if args.plot:
        from perseus.plot import frontier_png

        Path(args.plot).write_bytes(frontier_png(doc))
    first = frontier.points[0]
    saving = 100 * (1 - first.energy / frontier.max_frequency_energy)
    print(
        f"perseus: {len(frontier)} plans in {elapsed:.2f} s; T0 = {frontier.max_frequency_time:.4f} s, "
        f"E0 = {frontier.max_frequency_energy:.1f} J; fastest plan saves {saving:.1f} % at "
        f"T = {first.time:.4f} s (gap to bound {100 * first.gap:.2f} %)"
        + (f"; wrote {args.output}" if args.output else "")
        + (f" and {args.plot}" if args.plot else ""),
        file=sys.stderr,
    )
    if selected_line:
        print(selected_line, file=sys.stderr)
    if budget_line:
        print(budget_line.strip("\n"), file=sys.stderr)
    return 0


def _swing(
    args: argparse.Namespace, frontier: Any, profile: Any, blocking: float, doc: dict[str, Any]
) -> str:
    """Adds ``power_timeline`` (and ``swing`` under bounds) to ``doc``; the stderr lines."""
    from perseus.power import SwingBounds
    from perseus.power.timeline_plot import swing_outputs
    from perseus.problem import EnergyProblem

    bounds = None
    if args.max_swing is not None or args.max_ramp is not None:
        bounds = SwingBounds(args.max_swing, args.max_ramp, args.ramp_window)
    problem = EnergyProblem.build(profile, frontier.schedule, blocking)
    out, line = swing_outputs(frontier, problem, doc.get("selected"), bounds, args.power_timeline)
    doc.update(out)
    return "\n" + line


def _selection(args: argparse.Namespace) -> tuple[str, float, dict[str, float]] | None:
    """The plan policy given on the command line; ``None`` when no policy is given.

    There is one option per public parameter of :data:`perseus.policies.POLICIES`; ``eta``'s
    ``max_power`` defaults to the known GPU of the profile's name.
    """
    from perseus.errors import OptionError
    from perseus.policies import POLICIES, chosen
    from perseus_common.gpus import known_gpu_for

    given = {
        p.name: getattr(args, p.name)
        for pol in POLICIES.values()
        for p in pol.parameters
        if p.public
    }
    found = chosen(given)
    if found is None or found[0] != "eta" or "max_power" in found[2]:
        return found
    gpu = known_gpu_for(Path(args.profile).name)
    if gpu is None:
        raise OptionError(
            "--eta needs --max-power (W, one GPU's maximum power limit; known for A100/A40 "
            "profiles)",
            field="max_power",
        )
    print(
        f"perseus: using the maximum power limit of the {gpu.key.upper()}: "
        f"{gpu.max_power_limit:g} W",
        file=sys.stderr,
    )
    return found[0], found[1], {**found[2], "max_power": gpu.max_power_limit}


def _selected_doc(
    frontier: Any, name: str, value: float, options: dict[str, float]
) -> dict[str, Any]:
    """The point policy ``name`` selects, as the JSON's ``selected`` entry.

    Raises :class:`~perseus.errors.InfeasibleError` when no plan meets it.
    """
    from perseus.policies import POLICIES, resolve

    i = resolve(frontier, name, value, options)
    return {
        "policy": POLICIES[name].describe(value, options),
        name: value,
        **options,
        "point": i,
        "time": float(frontier.times[i]),
        "energy": float(frontier.energies[i]),
        "slowdown": float(frontier.times[i]) / frontier.max_frequency_time - 1.0,
    }


def _power_budget_doc(frontier: Any, profile: Any, blocking: float, watts: float) -> dict[str, Any]:
    """The fastest plan of ``frontier`` within ``watts``, as the JSON's ``power_budget`` entry.

    ``watts`` is for one pipeline.

    Raises :class:`~perseus.power.PowerBudgetError` when none is.
    """
    from perseus.power import peak_power, plan_for_power_budget
    from perseus.problem import EnergyProblem

    plan = plan_for_power_budget(frontier, watts)
    problem = EnergyProblem.build(profile, frontier.schedule, blocking)
    return {
        "watts": float(watts),
        "point": plan.index,
        "time": plan.time,
        "energy": plan.energy,
        "average_power": plan.average_power,
        "peak_power": peak_power(problem, frontier.plans[plan.index]),
        "slowdown": plan.slowdown,
    }


def _cmd_plot(args: argparse.Namespace) -> int:
    from perseus.plot import frontier_png

    doc: dict[str, Any] = json.loads(Path(args.frontier).read_text())
    if not isinstance(doc, dict) or "points" not in doc:
        raise SystemExit(f"perseus plot: {args.frontier} is not a frontier JSON (no 'points')")
    Path(args.output).write_bytes(frontier_png(doc))
    print(f"perseus: wrote {args.output}", file=sys.stderr)
    return 0


#: What the CLI says instead of the registry's words where they speak of a server's job.
_CLI_HELP = {
    "power_budget": "the fastest plan whose average power (this one pipeline, all its ranks) "
    "is at most W watts (also its peak power, in the JSON's 'power_budget')",
    "max_power": "with --eta: one GPU's maximum power limit, W (MAXPOWER = max_power x ranks; "
    "default: the known GPU's, for A100/A40 profiles)",
}


def _add_policy_options(f: argparse.ArgumentParser) -> None:
    """Add one option per public parameter of :data:`perseus.policies.POLICIES`.

    At most one policy may be given: the selected point goes to stderr and to the JSON's
    ``selected``; the exit status is 2 when no plan meets it.
    """
    from perseus.policies import POLICIES

    group = f.add_mutually_exclusive_group()
    for pol in POLICIES.values():
        p = pol.parameter
        group.add_argument(
            "--" + p.name.replace("_", "-"),
            type=int if p.integer else float,
            metavar=p.unit.upper() or ("I" if p.integer else "X"),
            help=f"also select {_CLI_HELP.get(p.name, pol.selects)} ({p.name} {p.bounds()})".replace(
                "`", ""
            ).replace("%", "%%"),
        )
    for pol in POLICIES.values():
        for o in pol.options:
            if o.public:
                f.add_argument(
                    "--" + o.name.replace("_", "-"),
                    type=float,
                    metavar=o.unit or "X",
                    help=_CLI_HELP.get(
                        o.name, f"with --{pol.name.replace('_', '-')}: {o.description}"
                    ).replace("%", "%%"),
                )


def build_parser(describe_apps: bool = True) -> argparse.ArgumentParser:
    """The ``perseus`` command line; the applications' subcommands described unless told not to.

    ``describe_apps=False`` lists them by name only, loading none of them (a core subcommand's
    own parse needs no more).
    """
    from perseus.app_commands import app_commands, describe
    from perseus.schedules import SCHEDULE_NAMES

    p = argparse.ArgumentParser(
        prog="perseus",
        description="Energy scheduler for pipeline-parallel training: time-energy frontier and GPU frequency plans.",
    )
    p.add_argument("--version", action="version", version=f"perseus {version()}")
    sub = p.add_subparsers(dest="command", required=True)

    f = sub.add_parser("frontier", help="compute the time-energy frontier of a profile")
    f.add_argument("profile", help="stage,instruction,frequency,time,energy CSV (or JSON)")
    f.add_argument("--stages", type=int, required=True, help="pipeline ranks")
    f.add_argument("--microbatches", type=int, required=True)
    f.add_argument("--schedule", default="1f1b", choices=SCHEDULE_NAMES)
    f.add_argument(
        "--virtual-stages", type=int, default=1, help="model chunks per rank (interleaved-1f1b)"
    )
    f.add_argument(
        "--profile-stages",
        metavar="LIST",
        help="use these stages of the profile, in this order, e.g. 0-3 or 0,2,4,6 (for a "
        "profile with more stages than the job; default: all of them)",
    )
    f.add_argument(
        "--blocking-power",
        type=float,
        help="watts a waiting GPU draws (known for A100/A40 profiles)",
    )
    f.add_argument(
        "--resolution", type=float, default=0.0, help="keep points at least this many seconds apart"
    )
    f.add_argument(
        "--plans", action="store_true", help="include every point's per-stage frequency plan"
    )
    f.add_argument(
        "--effort",
        type=float,
        default=1.0,
        help="how hard to search where plans are furthest from the lower bound: 1 (default) "
        "searches the zero-slowdown plan, each unit more also the 16 worst stretches of the "
        "frontier (about 1-2 s each for 192 instructions); 0 for no search",
    )
    _add_policy_options(f)
    f.add_argument("--output", "-o", help="write the JSON here (default: stdout)")
    f.add_argument("--plot", help="draw the frontier to this PNG")
    f.add_argument(
        "--power-timeline",
        metavar="PNG",
        help="draw the selected plan's power over two iterations (with --max-swing/--max-ramp: "
        "before and after its floors, the bound drawn)",
    )
    f.add_argument("--max-swing", type=float, help="bound 1 - trough/peak (0-1): adds 'swing'")
    f.add_argument("--max-ramp", type=float, help="bound every change within --ramp-window (0-1)")
    f.add_argument("--ramp-window", type=float, default=0.1, help="seconds (default 0.1)")
    f.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    f.set_defaults(func=_cmd_frontier)

    pl = sub.add_parser("plot", help="draw a frontier JSON as a PNG")
    pl.add_argument("frontier")
    pl.add_argument("--output", "-o", required=True)
    pl.set_defaults(func=_cmd_plot)

    apps = app_commands()
    for name, entry in apps.items():  # run by _dispatch before parsing
        if name not in CORE_COMMANDS:
            sub.add_parser(name, help=describe(entry) if describe_apps else None, add_help=False)
    if not apps:  # e.g. run from a source tree that was never installed
        p.epilog = NO_APPS
    return p


#: What ``perseus --help`` adds when no application registered a subcommand.
NO_APPS = (
    "No application's subcommand is registered: they are found in the installed metadata, so "
    "install Perseus (pip install -e . from a checkout) to run the server, the demo or gpud."
)


#: What the scheduler's commands import that a plain (rank-client) install lacks.
_SCHEDULER_DEPENDENCIES = frozenset(
    {
        "numpy",
        "scipy",
        "numba",
        "matplotlib",
        "fastapi",
        "starlette",
        "uvicorn",
        "httpx",
        "pydantic",
    }
)


def main(argv: list[str] | None = None) -> int:
    """Run the ``perseus`` command; returns the exit status."""
    try:
        return _dispatch(list(sys.argv[1:] if argv is None else argv))
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] not in _SCHEDULER_DEPENDENCIES:
            raise
        print(
            f"perseus: this command needs the scheduler, and {e.name!r} is not installed; "
            "install it with: pip install 'perseus[server]'",
            file=sys.stderr,
        )
        return 2


#: The core's own subcommands (the applications' are discovered).
CORE_COMMANDS = ("frontier", "plot")


def _dispatch(argv: list[str]) -> int:
    from perseus.app_commands import app_commands, load

    apps = app_commands()
    if argv and argv[0] in apps and argv[0] not in CORE_COMMANDS:
        return load(apps[argv[0]]).run(argv[1:])
    args = build_parser(describe_apps=not argv or argv[0] not in CORE_COMMANDS).parse_args(argv)
    from perseus.errors import PerseusError

    try:
        return int(args.func(args))
    except PerseusError as e:
        print(f"perseus {args.command}: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"perseus {args.command}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
