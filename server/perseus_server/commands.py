"""The server's subcommands of ``perseus``: ``serve`` and ``db``.

Registered as entry points of :data:`perseus_common.commands.GROUP` (see ``pyproject.toml``);
light to import, so ``perseus --help`` lists them on any install: the command lines themselves
(:mod:`perseus_server.cli`, :mod:`perseus_server.db_cli`) load when the subcommand runs.
"""

from __future__ import annotations

from perseus_common.commands import Subcommand

__all__ = ["SERVE", "DB"]


def _serve(argv: list[str]) -> int:
    from perseus_server.cli import main

    return main(argv)


def _db(argv: list[str]) -> int:
    from perseus_server.db_cli import main

    return main(argv)


#: ``perseus serve``: the REST and gRPC server.
SERVE = Subcommand(help="run the server (see `perseus serve --help`)", run=_serve)
#: ``perseus db``: the store's maintenance commands.
DB = Subcommand(help="the server's store: `perseus db migrate SRC DST` copies it", run=_db)
