"""The store's report history: each rank's iterations and its highest report sequences.

The hot path of report ingestion (every acknowledged report batch is one
:meth:`HistoryTables.add_iterations`), written once for SQLite and PostgreSQL on
:class:`~perseus_server.runtime.sql_connection.SqlConnection`:
:class:`~perseus_server.runtime.sql_store.SqlStore` inherits it.

Each rank's rows are numbered ``n`` = 1, 2, ... as they arrive, so a rank keeps its newest
``keep`` rows by deleting a range of its own numbers (an index range, without counting what it
holds). Writers of one job's iterations take turns (the job row is read ``FOR UPDATE`` on
PostgreSQL; SQLite's ``BEGIN IMMEDIATE`` holds the write lock): a job deleted meanwhile keeps
nothing, and each writer numbers its rows after the last one stored.
"""

from __future__ import annotations

import time
from typing import Any

import sqlalchemy as sa

from perseus_server.domain.rows import IterationRow, RankIteration
from perseus_server.runtime import store_tables as t
from perseus_server.runtime.sql_connection import SqlConnection

__all__ = ["HistoryTables"]

_I = t.iterations
_S = t.report_sequences
_LAST_N = (
    sa.select(_I.c.rank_id, sa.func.max(_I.c.n))
    .where(_I.c.rank_id.in_(sa.bindparam("ranks", expanding=True)))
    .group_by(_I.c.rank_id)
)
_TRIM = _I.delete().where(_I.c.rank_id == sa.bindparam("r"), _I.c.n <= sa.bindparam("cut"))
_NEWEST = (
    sa.select(_I.c.iteration, _I.c.time, _I.c.energy, _I.c.plan_version)
    .where(_I.c.rank_id == sa.bindparam("rank_id"))
    .order_by(_I.c.n.desc())
    .limit(sa.bindparam("limit"))
)


class HistoryTables(SqlConnection):
    """Iterations and report sequences (see the module docstring)."""

    def add_iterations(
        self,
        job_id: str,
        rows: list[IterationRow],
        keep: int,
        sequences: dict[tuple[str, int], int] | None = None,
        incarnations_kept: int = 8,
    ) -> None:
        """Append iterations, keep the newest ``keep`` per rank, and raise the report sequences.

        The highest accepted report sequence of each ``(rank_id, incarnation)`` is raised to
        ``sequences`` (never lowered), keeping the ``incarnations_kept`` most recently updated
        incarnations of each rank, in the same transaction.
        """
        if not rows:
            return
        received = time.time()
        job = sa.select(t.jobs.c.id).where(t.jobs.c.id == job_id).with_for_update()
        with self._tx() as db:
            if db.execute(job).first() is None:
                return
            if sequences:
                self._raise_sequences(db, job_id, sequences, received, incarnations_kept)
            ranks = sorted({r[0] for r in rows})
            last: dict[str, int] = {r: int(n) for r, n in db.execute(_LAST_N, {"ranks": ranks})}
            values = []
            for rank_id, iteration, time_s, energy, version in rows:
                n = last[rank_id] = last.get(rank_id, 0) + 1
                values.append({"rank_id": rank_id, "job_id": job_id, "n": n,
                               "iteration": iteration, "time": time_s, "energy": energy,
                               "plan_version": version, "received": received})  # fmt: skip
            db.execute(_I.insert(), values)
            cuts = [{"r": r, "cut": last[r] - keep} for r in ranks if last[r] > keep]
            if cuts:
                db.execute(_TRIM, cuts)

    def _raise_sequences(
        self,
        db: sa.Connection,
        job_id: str,
        sequences: dict[tuple[str, int], int],
        now: float,
        kept: int,
    ) -> None:
        """Raise each ``(rank, incarnation)``'s highest sequence (never lower it).

        Each rank keeps its ``kept`` most recently updated incarnations.
        """
        stmt = self.insert(_S)
        x = stmt.excluded
        stmt = stmt.on_conflict_do_update(
            index_elements=["rank_id", "incarnation"],
            set_={"last": sa.case((x.last > _S.c.last, x.last), else_=_S.c.last),
                  "updated": x.updated},
        )  # fmt: skip
        db.execute(
            stmt,
            [{"rank_id": r, "incarnation": int(inc), "job_id": job_id, "last": int(s),
              "updated": now} for (r, inc), s in sequences.items()],
        )  # fmt: skip
        ranks = sorted({r for r, _ in sequences})
        over = db.execute(
            sa.select(_S.c.rank_id)
            .where(_S.c.rank_id.in_(ranks))
            .group_by(_S.c.rank_id)
            .having(sa.func.count() > kept)
        ).scalars()
        grown = list(over)
        if grown:
            order = (_S.c.updated.desc(), _S.c.seq.desc())
            k = sa.func.row_number().over(partition_by=_S.c.rank_id, order_by=order).label("k")
            ranked = sa.select(_S.c.seq, k).where(_S.c.rank_id.in_(grown)).subquery()
            old = sa.select(ranked.c.seq).where(ranked.c.k > kept)
            db.execute(_S.delete().where(_S.c.seq.in_(old)))

    def report_sequences(self, job_id: str) -> dict[str, dict[int, int]]:
        """Per rank of the job, the highest accepted report sequence of each incarnation.

        As ``{rank_id: {incarnation: last}}``, each rank's incarnations least recently updated
        first.
        """
        out: dict[str, dict[int, int]] = {}
        stmt = (
            sa.select(_S.c.rank_id, _S.c.incarnation, _S.c.last)
            .where(_S.c.job_id == job_id)
            .order_by(_S.c.updated, _S.c.seq)
        )
        for rank_id, incarnation, last in self._rows(stmt):
            out.setdefault(str(rank_id), {})[int(incarnation)] = int(last)
        return out

    def iterations(self, rank_id: str, limit: int) -> list[RankIteration]:
        """The newest ``limit`` iterations of a rank, oldest first."""
        rows: list[Any] = self._rows(_NEWEST.params(rank_id=rank_id, limit=limit))
        return [(int(a), float(b), float(c), int(d)) for a, b, c, d in reversed(rows)]
