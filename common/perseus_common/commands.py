"""The subcommands the applications add to the ``perseus`` command.

The core's command line (``perseus.cli``) holds the core's own subcommands (``frontier``,
``plot``) and imports none of the applications: each application registers its subcommands as
entry points of the group :data:`GROUP` (``[project.entry-points."perseus.commands"]`` in
``pyproject.toml``: the entry point's name is the subcommand's), each naming a
:class:`Subcommand` in a module of the application that is light to import, so that
``perseus --help`` lists it on any install. The subcommand's own modules load only when it runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["GROUP", "Subcommand"]

#: The entry-point group the ``perseus`` command discovers its applications' subcommands in.
GROUP = "perseus.commands"


@dataclass(frozen=True)
class Subcommand:
    """One subcommand an application adds to ``perseus``.

    Attributes:
        help: the one line ``perseus --help`` shows for it.
        run: runs it with the arguments after its name; returns the exit status. It imports
            what the subcommand needs when called, so registering it costs nothing.
    """

    help: str
    run: Callable[[list[str]], int]
