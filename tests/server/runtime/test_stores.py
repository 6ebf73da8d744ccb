"""Which database ``--db`` names (``runtime/stores.py``): the kind, the file, the log's form."""

from __future__ import annotations

from pathlib import Path

import pytest

from perseus_server.domain.jobs import JobSpec
from perseus_server.domain.store import StoreError
from perseus_server.runtime.sql_store import SqlStore
from perseus_server.runtime.stores import describe, engine_for, is_postgres, open_store, sqlite_path


def test_postgres_urls_of_both_spellings_name_postgres_and_nothing_else_does(
    tmp_path: Path,
) -> None:
    assert is_postgres("postgresql://perseus@db:5432/perseus")
    assert is_postgres("postgres://perseus@db/perseus")
    for other in ("sqlite:///a.db", "perseus.db", "mysql://x@db/y", tmp_path / "postgres://x"):
        assert not is_postgres(other)


def test_sqlite_targets_name_their_file() -> None:
    assert sqlite_path("perseus.db") == Path("perseus.db")
    assert sqlite_path("sqlite:///rel/a.db") == Path("rel/a.db")
    assert sqlite_path("sqlite:////abs/a.db") == Path("/abs/a.db")
    assert sqlite_path("sqlite:///:memory:") == Path(":memory:")
    assert sqlite_path(Path("/x/y.db")) == Path("/x/y.db")
    with pytest.raises(StoreError, match=r"--db mysql://\.\.\.: unknown kind of database 'mysql'"):
        sqlite_path("mysql://perseus@db/perseus")


def test_the_log_shows_a_url_without_its_password() -> None:
    assert describe("postgresql://perseus:s3cret@db:5432/p") == "postgresql://perseus:***@db:5432/p"
    assert describe("postgres://perseus@db/p") == "postgres://perseus@db/p"
    assert describe("postgresql://db/p") == "postgresql://db/p"
    assert describe("perseus.db") == "perseus.db"
    assert "s3cret" not in describe("postgresql://u:p@ss:s3cret@db/p")


def test_open_store_opens_a_migrated_sql_store_on_the_file(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'b.db'}")
    try:
        assert isinstance(store, SqlStore)
        store.add_job("x", JobSpec(stages=2, microbatches=4))
    finally:
        store.close()
    engine = engine_for(tmp_path / "b.db")
    try:
        with engine.connect() as db:
            assert db.exec_driver_sql("SELECT id FROM jobs").scalars().all() == ["x"]
    finally:
        engine.dispose()
