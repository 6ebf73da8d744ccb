"""The store's tables, defined once for SQLite and PostgreSQL (SQLAlchemy Core).

:class:`~perseus_server.runtime.sql_store.SqlStore` reads and writes these; the Alembic history
(:mod:`perseus_server.runtime.schema`) creates and changes them. Adding a column is one line
here and one migration there.

Text keys compare as PostgreSQL's ``"C"`` collation on PostgreSQL, so that ties order as
SQLite's do (by code point) whatever the database's locale. ``iterations.seq`` and
``report_sequences.seq`` number the rows in insertion order (SQLite's rowid); ``iterations.n``
numbers each rank's rows (1, 2, ...), so a rank keeps its newest rows by deleting a range of its
numbers. ``perseus_lease`` and ``perseus_epoch`` are the leadership of servers sharing one
PostgreSQL database (:mod:`perseus_server.runtime.leadership`; unused on SQLite).
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

__all__ = [
    "JOB_TABLES",
    "KEY",
    "SEQ",
    "credentials",
    "deployments",
    "frontiers",
    "iterations",
    "job_lifecycle",
    "jobs",
    "metadata",
    "power_budget",
    "profiles",
    "profiling",
    "rank_bindings",
    "ranks",
    "report_sequences",
    "tenants",
]

#: A text key: ``COLLATE "C"`` on PostgreSQL (code-point order, as SQLite's).
KEY = sa.Text().with_variant(postgresql.TEXT(collation="C"), "postgresql")
#: An insertion-order row number: SQLite's rowid, a PostgreSQL identity.
SEQ = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_REAL: sa.Double[float] = sa.Double()

metadata = sa.MetaData()

tenants = sa.Table(
    "tenants",
    metadata,
    sa.Column("id", KEY, primary_key=True),
    sa.Column("created", _REAL, nullable=False),
    sa.Column("max_jobs", sa.Integer),
    sa.Column("max_gpus", sa.Integer),
    sa.Column("weight", _REAL, nullable=False, server_default="1"),
    sa.Column("guaranteed_watts", _REAL, nullable=False, server_default="0"),
)
jobs = sa.Table(
    "jobs",
    metadata,
    sa.Column("id", KEY, primary_key=True),
    sa.Column("created", _REAL, nullable=False),
    sa.Column("spec", sa.Text, nullable=False),
    sa.Column("tenant", KEY, nullable=False, server_default="default", index=True),
)
profiles = sa.Table(
    "profiles",
    metadata,
    sa.Column("job_id", KEY, primary_key=True),
    sa.Column("csv", sa.Text, nullable=False),
    sa.Column("revision", sa.Integer, nullable=False),
    sa.Column("updated", _REAL, nullable=False),
    sa.Column("source", sa.Text, nullable=False),
)
frontiers = sa.Table(
    "frontiers",
    metadata,
    sa.Column("job_id", KEY, primary_key=True),
    sa.Column("status", sa.Text, nullable=False),
    sa.Column("progress", _REAL, nullable=False),
    sa.Column("error", sa.Text),
    sa.Column("doc", sa.Text),
    sa.Column("profile_revision", sa.Integer),
    sa.Column("started", _REAL),
    sa.Column("finished", _REAL),
    sa.Column("solve_seconds", _REAL),
    sa.Column("partial", sa.Boolean, nullable=False, server_default=sa.false()),
)
deployments = sa.Table(
    "deployments",
    metadata,
    sa.Column("job_id", KEY, primary_key=True),
    sa.Column("version", sa.BigInteger, nullable=False),
    sa.Column("doc", sa.Text, nullable=False),
    sa.Column("updated", _REAL, nullable=False),
)
ranks = sa.Table(
    "ranks",
    metadata,
    sa.Column("job_id", KEY, primary_key=True),
    sa.Column("global_rank", sa.Integer, primary_key=True),
    sa.Column("rank_id", KEY, nullable=False, unique=True),
    sa.Column("info", sa.Text, nullable=False),
    sa.Column("registered", _REAL, nullable=False),
)
iterations = sa.Table(
    "iterations",
    metadata,
    sa.Column("seq", SEQ, sa.Identity(always=True), primary_key=True),
    sa.Column("rank_id", KEY, nullable=False),
    sa.Column("n", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("job_id", KEY, nullable=False, index=True),
    sa.Column("iteration", sa.BigInteger, nullable=False),
    sa.Column("time", _REAL, nullable=False),
    sa.Column("energy", _REAL, nullable=False),
    sa.Column("plan_version", sa.BigInteger, nullable=False),
    sa.Column("received", _REAL, nullable=False),
    sa.Index("iterations_rank", "rank_id", "n"),
)
profiling = sa.Table(
    "profiling",
    metadata,
    sa.Column("job_id", KEY, primary_key=True),
    sa.Column("doc", sa.Text, nullable=False),
)
report_sequences = sa.Table(
    "report_sequences",
    metadata,
    sa.Column("seq", SEQ, sa.Identity(always=True), primary_key=True),
    sa.Column("rank_id", KEY, nullable=False),
    sa.Column("incarnation", sa.BigInteger, nullable=False),
    sa.Column("job_id", KEY, nullable=False, index=True),
    sa.Column("last", sa.BigInteger, nullable=False),
    sa.Column("updated", _REAL, nullable=False),
    sa.UniqueConstraint("rank_id", "incarnation", name="report_sequences_rank"),
)
power_budget = sa.Table(
    "power_budget",
    metadata,
    sa.Column("id", sa.Integer, sa.CheckConstraint("id = 1"), primary_key=True),
    sa.Column("doc", sa.Text, nullable=False),
    sa.Column("updated", _REAL, nullable=False),
)
credentials = sa.Table(
    "credentials",
    metadata,
    sa.Column("id", KEY, primary_key=True),
    sa.Column("scope", sa.Text, nullable=False),
    sa.Column("job_id", KEY, index=True),
    sa.Column("hash", sa.Text, nullable=False, unique=True),
    sa.Column("created", _REAL, nullable=False),
    sa.Column("rotated", _REAL),
    sa.Column("revoked", _REAL),
    sa.Column("tenant", KEY, index=True),
)
rank_bindings = sa.Table(
    "rank_bindings",
    metadata,
    sa.Column("rank_id", KEY, primary_key=True),
    sa.Column("job_id", KEY, nullable=False),
    sa.Column("global_rank", sa.Integer, nullable=False),
    sa.Column("credential_id", sa.Text, nullable=False),
    sa.UniqueConstraint("job_id", "global_rank"),
)
job_lifecycle = sa.Table(
    "job_lifecycle",
    metadata,
    sa.Column("job_id", KEY, primary_key=True),
    sa.Column("state", sa.Text, nullable=False),
    sa.Column("since", _REAL, nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
)
perseus_lease = sa.Table(
    "perseus_lease",
    metadata,
    sa.Column("id", sa.Integer, sa.CheckConstraint("id = 1"), primary_key=True),
    sa.Column("holder", sa.Text, nullable=False),
    sa.Column("expires", sa.DateTime(timezone=True), nullable=False),
    sa.Column("advertise", sa.Text, nullable=False, server_default=""),
)
perseus_epoch = sa.Table(
    "perseus_epoch",
    metadata,
    sa.Column("id", sa.Integer, sa.CheckConstraint("id = 1"), primary_key=True),
    sa.Column("epoch", sa.BigInteger, nullable=False),
    sa.Column("holder", sa.Text, nullable=False),
    sa.Column("since", sa.DateTime(timezone=True), nullable=False),
)

#: ``(table, column naming the job)`` of everything :meth:`Store.delete_job` forgets.
JOB_TABLES: tuple[tuple[sa.Table, sa.Column[str]], ...] = (
    (jobs, jobs.c.id),
    *((t, t.c.job_id) for t in (profiles, frontiers, deployments, ranks, iterations)),
    *((t, t.c.job_id) for t in (profiling, report_sequences, credentials, rank_bindings)),
    (job_lifecycle, job_lifecycle.c.job_id),
)
