"""The node daemon's subcommand of ``perseus``: ``gpud``.

Registered as an entry point of :data:`perseus_common.commands.GROUP` (see ``pyproject.toml``);
light to import: :mod:`perseus_gpud.cli` loads when the subcommand runs.
"""

from __future__ import annotations

from perseus_common.commands import Subcommand

__all__ = ["GPUD"]


def _gpud(argv: list[str]) -> int:
    from perseus_gpud.cli import main

    return main(argv)


#: ``perseus gpud``: the node daemon (``serve``, ``status``).
GPUD = Subcommand(
    help="the node daemon: clock control for unprivileged trainers (see `perseus gpud --help`)",
    run=_gpud,
)
