"""A module name says one thing: where two of our modules share a file name, they mean the same.

A newcomer who has read ``service/power_budget.py`` expects ``rest/power_budget.py`` to be the same
feature's routes, not something else that happens to be about power. So every file name that more
than one of our packages' modules use is listed in :data:`SHARED` with the one thing it means in
each place; a new shared name fails here until it is listed (or one of them is renamed).

Run as a script, it prints every shared name and where it is used.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = (
    ROOT / "perseus",
    ROOT / "common" / "perseus_common",
    ROOT / "client" / "perseus_client",
    ROOT / "gpud" / "perseus_gpud",
    ROOT / "server" / "perseus_server",
    ROOT / "demo" / "perseus_demo",
)

#: Each file name several modules share, and the one thing it means in each of them.
SHARED = {
    "errors.py": "a package's exception types (the core's, the client's, the demo's, the API's)",
    "cli.py": "an application's command line",
    "commands.py": "the subcommands an application adds to ``perseus`` (and their registry)",
    "options.py": "a component's option object (the client's, the demo's, the solver's)",
    "server.py": "an application's servers and their lifecycle (the scheduler's, the daemon's)",
    "metrics.py": "an application's Prometheus metrics",
    "base.py": "a package's base classes (GPU backends, response models)",
    "swing.py": "the power-swing bound, at each layer (plans, their answers, the demo's)",
    "floors.py": "per-rank power floors: chosen (core) and applied (client)",
    "reports.py": "iteration reports: built (client) and taken in (server)",
    "profiles.py": "per-stage profiles: the model (core) and its routes (REST)",
    "gate.py": "an adapter's gate: what is checked before a call reaches the service",
    "jobs.py": "the jobs feature: a job's values (domain) and its routes (REST)",
    "plans.py": "the plans feature: its routes (REST) and its queries (service)",
    "power_budget.py": "the cluster power budget: its routes (REST) and its decisions (service)",
    "credentials.py": "the credentials feature: its routes (REST) and the authority (service)",
    "tenants.py": "the tenants feature: its routes (REST) and its quotas (service)",
    "stragglers.py": "the stragglers feature: its routes (REST) and its decisions (service)",
    "zeus.py": "Zeus's routes (REST) and the runs behind them (service)",
}


def shared_names() -> dict[str, list[str]]:
    """Every file name more than one of our modules uses, and where."""
    where: dict[str, list[str]] = defaultdict(list)
    for package in PACKAGES:
        for path in sorted(package.rglob("*.py")):
            if path.name in ("__init__.py", "__main__.py") or path.name.endswith("_pb2.py"):
                continue
            if path.name.endswith("_pb2_grpc.py"):
                continue
            where[path.name].append(str(path.relative_to(ROOT)))
    return {name: paths for name, paths in sorted(where.items()) if len(paths) > 1}


def test_every_shared_module_name_means_one_thing() -> None:
    found = shared_names()
    unlisted = {name: paths for name, paths in found.items() if name not in SHARED}
    assert not unlisted, (
        "module names used more than once: rename one, or list the one thing they mean in "
        f"SHARED: {unlisted}"
    )


def test_the_table_lists_only_shared_names() -> None:
    """A name no longer shared leaves the table (so the table stays the truth)."""
    assert set(SHARED) <= set(shared_names()), set(SHARED) - set(shared_names())


if __name__ == "__main__":
    for name, paths in shared_names().items():
        print(f"{name:20} {SHARED.get(name, 'NOT LISTED')}")
        for p in paths:
            print(f"    {p}")
