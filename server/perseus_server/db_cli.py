"""``perseus db``: the store's maintenance commands.

``perseus db migrate SRC DST`` copies a whole store into an empty one (SQLite into PostgreSQL,
or back): see :mod:`perseus_server.runtime.db_copy`.
"""

from __future__ import annotations

import argparse
import sys

from perseus_server.domain.store import StoreError
from perseus_server.runtime.db_copy import copy_database
from perseus_server.runtime.stores import describe

__all__ = ["build_parser", "main"]


def build_parser(prog: str = "perseus db") -> argparse.ArgumentParser:
    """The ``perseus db`` command line: its maintenance subcommands."""
    p = argparse.ArgumentParser(prog=prog, description="The server's store: maintenance.")
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser(
        "migrate",
        help="copy a store into an empty one (SQLite into PostgreSQL, or back)",
        description="Copy every job, profile, frontier, plan, rank, report history, credential "
        "and setting of SRC into the empty DST, in one transaction. Stop the server first. "
        "Each is a SQLite file (a path or sqlite:///PATH) or a PostgreSQL URL "
        "(postgresql://USER@HOST/DB).",
    )
    m.add_argument("src", metavar="SRC", help="the store to copy")
    m.add_argument("dst", metavar="DST", help="an empty store (created when absent)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run ``perseus db`` with ``argv``; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        copied = copy_database(args.src, args.dst, say=lambda line: print(f"perseus db: {line}"))
    except StoreError as e:
        print(f"perseus db migrate: {e}", file=sys.stderr)
        return 1
    print(
        f"perseus db: copied {sum(copied.values())} rows of {describe(args.src)} into "
        f"{describe(args.dst)}"
    )
    return 0
