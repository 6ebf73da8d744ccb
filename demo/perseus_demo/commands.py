"""The demo's subcommand of ``perseus``: ``demo``.

Registered as an entry point of :data:`perseus_common.commands.GROUP` (see ``pyproject.toml``);
light to import, so ``perseus --help`` lists it on any install: :mod:`perseus_demo.cli` loads
when the subcommand runs.
"""

from __future__ import annotations

from perseus_common.commands import Subcommand

__all__ = ["DEMO"]


def _demo(argv: list[str]) -> int:
    from perseus_demo.cli import main

    return main(argv)


#: ``perseus demo``: the whole system on this machine, with simulated GPUs.
DEMO = Subcommand(help="the whole system on this machine (see `perseus demo --help`)", run=_demo)
