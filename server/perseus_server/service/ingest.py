"""Iteration reports committed off the event loop, in groups: :class:`ReportWriter`.

With a database server (PostgreSQL) a commit is a network round trip and, with
``synchronous_commit`` on, a flush of its log: a millisecond or more. Made on the event loop for
every report, it would stop every other request meanwhile and bound ingestion to one report per
commit. The writer instead queues each checked report, and one task at a time takes everything
queued: it sets re-sent reports apart (:meth:`Reports.prepare`, on the loop), stores the rest in
**one transaction on its own thread** (:meth:`Reports.write`), and once that committed applies
them in memory (:meth:`Reports.apply`, on the loop) and answers each waiting caller. A report is
acknowledged only after its commit, as on SQLite; reports that arrive meanwhile form the next
group, so the busier the server the larger the groups (group commit).

A failed commit fails every report of its group (nothing of it was stored or applied; the
ranks send them again); a report whose job was deleted or changed while it waited is checked
again, alone. Only a store that may be used from two threads at once
(``thread_safe = True``: :class:`~perseus_server.runtime.sql_store.SqlStore` on PostgreSQL) is given
a writer; the SQLite store stays on the loop, where a commit takes microseconds.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from perseus_server.domain.store import Store
from perseus_server.service.report_checks import CheckedReport
from perseus_server.service.reports import PreparedReports, Reports

__all__ = ["MAX_GROUP", "ReportWriter"]

#: Reports committed in one transaction at most.
MAX_GROUP = 4096


class ReportWriter:
    """Group commit of checked reports on a thread of its own (see the module docstring)."""

    def __init__(self, reports: Reports, store: Store) -> None:
        if not getattr(store, "thread_safe", False):
            raise ValueError("a report writer needs a store that may be used from two threads")
        self.reports = reports
        self.store = store
        self._queue: list[tuple[CheckedReport, asyncio.Future[tuple[int, int]]]] = []
        self._task: asyncio.Task[None] | None = None
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="perseus-store")
        #: Groups committed and reports in them (for the benchmarks and tests).
        self.groups = 0
        self.written = 0

    async def record(self, checked: CheckedReport) -> tuple[int, int]:
        """Store one checked report with whatever else is waiting.

        Returns (new, duplicates) once committed and applied.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[tuple[int, int]] = loop.create_future()
        self._queue.append((checked, future))
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        while self._queue:
            group, self._queue = self._queue[:MAX_GROUP], self._queue[MAX_GROUP:]
            await self._commit(group)

    async def _commit(
        self, group: list[tuple[CheckedReport, asyncio.Future[tuple[int, int]]]]
    ) -> None:
        jobs = self.reports.ctx.jobs
        ready: list[tuple[CheckedReport, asyncio.Future[tuple[int, int]]]] = []
        for c, future in group:
            if c.job.id not in jobs or jobs.get(c.job.id) is not c.job:
                try:  # its job changed while it waited: check it again, alone
                    c = self.reports.check(c.index, c.report)
                except Exception as e:
                    _fail(future, e)
                    continue
            ready.append((c, future))
        if not ready:
            return
        try:
            prepared = self.reports.prepare([c for c, _ in ready])
            if prepared.accepted:
                await asyncio.get_running_loop().run_in_executor(
                    self._thread, self._write, prepared
                )
            self.reports.apply(prepared)
        except Exception as e:
            for _, future in ready:
                _fail(future, e)
            return
        self.groups += 1
        self.written += len(prepared.accepted)
        for (_, future), new in zip(ready, prepared.new, strict=True):
            if not future.done():
                future.set_result((1, 0) if new else (0, 1))

    def _write(self, prepared: PreparedReports) -> None:
        """On the writer's thread: one transaction for the whole group."""
        with self.store.transaction():
            self.reports.write(prepared)

    def close(self) -> None:
        """Stop the writer thread once what is queued is written."""
        self._thread.shutdown(wait=True)


def _fail(future: asyncio.Future[tuple[int, int]], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)
