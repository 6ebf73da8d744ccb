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

from perseus_server.domain.rows import IterationRow, RankIteration
from perseus_server.runtime.sql_connection import Db, SqlConnection

__all__ = ["HistoryTables"]


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
        now = time.time()
        with self._tx() as db:
            if (
                db.run("SELECT 1 FROM jobs WHERE id = ?" + db.for_update, (job_id,)).fetchone()
                is None
            ):
                return
            if sequences:
                _raise_sequences(db, job_id, sequences, now, incarnations_kept)
            ranks = sorted({r[0] for r in rows})
            last = dict.fromkeys(ranks, 0)
            for rank_id, n in db.run(
                f"SELECT rank_id, MAX(n) FROM iterations WHERE rank_id IN ({_marks(ranks)}) "
                "GROUP BY rank_id",
                ranks,
            ).fetchall():
                last[rank_id] = int(n)
            values = []
            for rank_id, iteration, time_s, energy, version in rows:
                n = last[rank_id] = last[rank_id] + 1
                values.append((rank_id, job_id, n, iteration, time_s, energy, version, now))
            db.many(
                "INSERT INTO iterations (rank_id, job_id, n, iteration, time, energy, "
                "plan_version, received) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                values,
            )
            cuts = [(r, n - keep) for r, n in last.items() if n > keep]
            if cuts:
                db.many("DELETE FROM iterations WHERE rank_id = ? AND n <= ?", cuts)

    def report_sequences(self, job_id: str) -> dict[str, dict[int, int]]:
        """Per rank of the job, the highest accepted report sequence of each incarnation.

        As ``{rank_id: {incarnation: last}}``, each rank's incarnations least recently updated
        first.
        """
        out: dict[str, dict[int, int]] = {}
        for rank_id, incarnation, last in self._rows(
            "SELECT rank_id, incarnation, last FROM report_sequences WHERE job_id = ? "
            "ORDER BY updated, seq",
            (job_id,),
        ):
            out.setdefault(str(rank_id), {})[int(incarnation)] = int(last)
        return out

    def iterations(self, rank_id: str, limit: int) -> list[RankIteration]:
        """The newest ``limit`` iterations of a rank, oldest first."""
        rows = self._rows(
            "SELECT iteration, time, energy, plan_version FROM iterations WHERE rank_id = ? "
            "ORDER BY n DESC LIMIT ?",
            (rank_id, limit),
        )
        return [(int(a), float(b), float(c), int(d)) for a, b, c, d in reversed(rows)]


def _marks(values: list[str]) -> str:
    """One placeholder per value (an ``IN`` list)."""
    return ", ".join("?" * len(values))


def _raise_sequences(
    db: Db, job_id: str, sequences: dict[tuple[str, int], int], now: float, kept: int
) -> None:
    """Raise each ``(rank, incarnation)``'s highest sequence (never lower it).

    Each rank keeps its ``kept`` most recently updated incarnations.
    """
    db.many(
        "INSERT INTO report_sequences (rank_id, incarnation, job_id, last, updated) "
        "VALUES (?, ?, ?, ?, ?) ON CONFLICT (rank_id, incarnation) DO UPDATE SET "
        "last = CASE WHEN excluded.last > report_sequences.last THEN excluded.last "
        "ELSE report_sequences.last END, updated = excluded.updated",
        [(r, int(inc), job_id, int(s), now) for (r, inc), s in sequences.items()],
    )
    ranks = sorted({r for r, _ in sequences})
    grown = db.run(
        f"SELECT rank_id FROM report_sequences WHERE rank_id IN ({_marks(ranks)}) "
        "GROUP BY rank_id HAVING COUNT(*) > ?",
        [*ranks, kept],
    ).fetchall()
    for (rank_id,) in grown:
        db.run(
            "DELETE FROM report_sequences WHERE rank_id = ? AND seq NOT IN (SELECT seq "
            "FROM report_sequences WHERE rank_id = ? ORDER BY updated DESC, seq DESC LIMIT ?)",
            (rank_id, rank_id, kept),
        )
