"""The applications' subcommands of ``perseus``, discovered, never imported by name.

The core imports nothing of the applications (``tests/test_layering.py`` checks it, the CLI
included): each registers its subcommands as entry points of
:data:`perseus_common.commands.GROUP`, and the ``perseus`` command finds them in the installed
metadata. A subcommand's :class:`~perseus_common.commands.Subcommand` is loaded only to run it
or to show its line of ``perseus --help``.
"""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points

from perseus_common.commands import GROUP, Subcommand

__all__ = ["app_commands", "load", "describe"]


def app_commands() -> dict[str, EntryPoint]:
    """Every registered subcommand's entry point by name (the first, where two share a name)."""
    found: dict[str, EntryPoint] = {}
    for entry in entry_points(group=GROUP):
        found.setdefault(entry.name, entry)
    return dict(sorted(found.items()))


def load(entry: EntryPoint) -> Subcommand:
    """The subcommand ``entry`` names (``TypeError`` when it names something else)."""
    command = entry.load()
    if not isinstance(command, Subcommand):
        raise TypeError(
            f"the {GROUP} entry point {entry.name!r} ({entry.value}) is not a Subcommand"
        )
    return command


def describe(entry: EntryPoint) -> str:
    """The subcommand's ``perseus --help`` line, or why it cannot be loaded."""
    try:
        return load(entry).help
    except Exception as exc:  # a broken application must not break `perseus --help`
        return f"(cannot be loaded: {type(exc).__name__}: {exc})"
