"""The schema both stores had when they moved to Alembic.

A new database gets it; a database stamped by the stores' earlier version tables (SQLite's
``user_version``, PostgreSQL's ``perseus_schema``) is brought to it in place, every row kept.

Revision ID: 0001
Revises:
Create Date: 2026-12-07
"""

from __future__ import annotations

from alembic import op

from perseus_server.domain.store import StoreError
from perseus_server.runtime.schema import legacy_postgres, legacy_sqlite

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    """The earlier history's steps still missing, then the baseline."""
    bind = op.get_bind()
    legacy = legacy_postgres if bind.dialect.name == "postgresql" else legacy_sqlite
    found = legacy.version(bind)
    if found > len(legacy.STEPS):
        raise StoreError(
            f"the database has schema version {found}, newer than this server's; "
            "use a newer server or another database"
        )
    for step in legacy.STEPS[found:]:
        step(bind)
    legacy.finish(bind)


def downgrade() -> None:
    """Not supported: a store is upgraded, never downgraded (restore a backup instead)."""
    raise NotImplementedError("the store's schema is never downgraded")
