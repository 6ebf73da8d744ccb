"""Alembic's environment for the store's history (see :mod:`perseus_server.runtime.schema`).

Given a connection (``perseus`` opening a store) it migrates on it; run by ``alembic`` itself,
it opens the database that ``-x db=URL`` (or ``PERSEUS_DB``, or ``sqlalchemy.url``) names and
migrates under the same lock.
"""

from __future__ import annotations

import os
from typing import Any

from alembic import context

from perseus_server.runtime.schema import locked
from perseus_server.runtime.stores import engine_for


def _run(conn: Any) -> None:
    context.configure(connection=conn)
    with context.begin_transaction():
        context.run_migrations()


given = context.config.attributes.get("connection")
if given is not None:
    _run(given)
else:
    target = (
        context.get_x_argument(as_dictionary=True).get("db")
        or os.environ.get("PERSEUS_DB")
        or context.config.get_main_option("sqlalchemy.url")
    )
    if not target:
        raise SystemExit("name the database: alembic -x db=URL ... (or PERSEUS_DB=URL)")
    engine = engine_for(target, pool_size=1)
    try:
        with engine.connect() as conn, locked(conn):
            _run(conn)
    finally:
        engine.dispose()
