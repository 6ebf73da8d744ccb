"""``runtime/schema/env.py``: Alembic's environment, as operators run it and as the store does.

``alembic -x db=URL upgrade head`` with the repository's ``alembic.ini`` opens the database
itself and migrates under the lock; without a database named it says how to name one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from perseus_server.runtime import schema
from perseus_server.runtime.sql_store import SqlStore

from ...store_fixture import COUNTS, assert_holds, sqlite_copy
from .databases import counts, revision_of

ROOT = Path(__file__).resolve().parents[4]


def test_operators_upgrade_with_alembic_itself(tmp_path: Path) -> None:
    """``alembic -x db=PATH upgrade head`` with the repository's ``alembic.ini``."""
    path = sqlite_copy(tmp_path / "old.db")
    alembic = [sys.executable, "-m", "alembic", "-c", str(ROOT / "alembic.ini"), "-x", f"db={path}"]
    subprocess.run([*alembic, "upgrade", "head"], check=True, capture_output=True, cwd=tmp_path)
    assert revision_of(path) == schema.head() and counts(path) == COUNTS
    current = subprocess.run([*alembic, "current"], check=True, capture_output=True, text=True)
    assert f"{schema.head()} (head)" in current.stdout
    store = SqlStore.open(path)  # and the server takes it as it is
    try:
        assert_holds(store)
    finally:
        store.close()


def test_alembic_without_a_database_named_says_how_to_name_one(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PERSEUS_DB"}
    run = subprocess.run(
        [sys.executable, "-m", "alembic", "-c", str(ROOT / "alembic.ini"), "upgrade", "head"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    assert run.returncode != 0
    assert "name the database: alembic -x db=URL" in run.stderr + run.stdout
    assert list(tmp_path.iterdir()) == []  # nothing created on the way


def test_perseus_db_names_the_database_too(tmp_path: Path) -> None:
    path = tmp_path / "named.db"
    subprocess.run(
        [sys.executable, "-m", "alembic", "-c", str(ROOT / "alembic.ini"), "upgrade", "head"],
        check=True,
        capture_output=True,
        cwd=tmp_path,
        env={**os.environ, "PERSEUS_DB": str(path)},
    )
    assert revision_of(path) == schema.head()
