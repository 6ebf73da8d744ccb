"""``testing/postgres.py``: a throwaway PostgreSQL server for tests and benchmarks.

A real ``initdb`` / ``pg_ctl`` server (the session's, from ``tests/server/postgres_backend.py``):
its URLs reach it over its Unix socket, each created database starts empty, and a failing binary
is a clear error carrying its output.
"""

from __future__ import annotations

import tempfile
import uuid
from pathlib import Path

import psycopg
import pytest

from perseus_server.testing.postgres import USER, PostgresServer

from ..postgres_backend import postgres

__all__ = ["postgres"]  # the session's PostgreSQL server (a fixture)


def test_its_url_reaches_the_server_as_its_user(postgres: PostgresServer) -> None:
    assert f"host={postgres.dir}" in postgres.url() and f"port={postgres.port}" in postgres.url()
    with psycopg.connect(postgres.url()) as conn:
        row = conn.execute("SELECT current_user, current_database()").fetchone()
    assert row == (USER, "postgres")
    assert "database system is ready to accept connections" in postgres.log()


def test_a_created_database_is_new_and_empty(postgres: PostgresServer) -> None:
    name = f"t_{uuid.uuid4().hex[:12]}"
    url = postgres.create_database(name)
    assert url == postgres.url(name)
    with psycopg.connect(url) as conn:
        tables = conn.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'"
        ).fetchone()
    assert tables == (0,)
    with pytest.raises(psycopg.errors.DuplicateDatabase):
        postgres.create_database(name)


def test_a_failing_binary_says_which_and_what_it_printed() -> None:
    # In a directory of its own that anyone may read: run as root, the binaries run as nobody.
    with tempfile.TemporaryDirectory(prefix="perseus-fake-pg-") as bin_dir:
        Path(bin_dir).chmod(0o755)
        initdb = Path(bin_dir) / "initdb"
        initdb.write_text("#!/bin/sh\necho 'initdb: cannot create the cluster' >&2\nexit 3\n")
        initdb.chmod(0o755)
        pg = PostgresServer(bin_dir=Path(bin_dir))
        with pytest.raises(RuntimeError, match=r"initdb failed \(3\): initdb: cannot create"):
            pg.start()
    assert not pg.started
    pg.stop()  # never started: only its directory goes
    assert not pg.dir.exists()
