"""Profile parsing and report decoding in worker processes.

For inputs large enough to hold the GIL for long.

Parsing runs in C for long stretches (``json.loads``, the regular expressions of the depth
check) that keep the GIL, so a worker *thread* would still stall the event loop; a worker
process does not. Small documents are parsed on a thread (no round trip). The pool is created on
first use (spawned: it imports only the core), holds one process, and outlives any one upload.

:func:`parse_profile_doc` returns plain values (the profile and its canonical CSV, or the error's
detail, field and row), since the errors' keyword fields do not survive pickling.

:class:`ReportPool` does the same for large iteration reports: the serialized message goes to
its own worker process (one, spawned on first use), which parses it and pulls the measurements
into arrays (the decoder it is given: the gRPC adapter's ``decode_report_bytes``, a module-level
function, so it pickles by name); what comes back is a few
arrays, not an object per measurement. Should the worker die, the report is decoded on a thread
instead (same value, only slower), so no report is lost to it.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from perseus_common.wire.values import IterationReport

__all__ = ["ParsePool", "ReportPool", "parse_profile_doc", "PROCESS_THRESHOLD"]

#: Documents larger than this (bytes) are parsed in the worker process.
PROCESS_THRESHOLD = 1024 * 1024


def parse_profile_doc(
    text: str, is_json: bool, schedule_json: dict[str, Any], blocking_power: float
) -> tuple[Any, ...]:
    """Parse and check a profile against the schedule.

    Returns ``("ok", profile, csv_text)`` or ``("error", detail, field, row)``.
    """
    from perseus.errors import ProfileError
    from perseus.problem import EnergyProblem
    from perseus.profiles import parse_profile_csv, parse_profile_json
    from perseus.schedules import Schedule
    from perseus_common.profile_csv import ProfileFormatError, load_json

    try:
        prof = parse_profile_json(load_json(text)) if is_json else parse_profile_csv(text)
        EnergyProblem.build(prof, Schedule.from_json(schedule_json), blocking_power)
    except (ProfileError, ProfileFormatError) as e:
        return ("error", str(e), e.field, e.row)
    return ("ok", prof, prof.to_csv())


class ParsePool:
    """One spawned worker process for large profile documents (see the module docstring)."""

    def __init__(self, threshold: int = PROCESS_THRESHOLD) -> None:
        self.threshold = threshold
        self._pool: ProcessPoolExecutor | None = None

    async def parse(
        self, text: str, is_json: bool, schedule_json: dict[str, Any], blocking_power: float
    ) -> tuple[Any, ...]:
        """Parse and check a profile as :func:`parse_profile_doc` does; a large one in the worker.

        Texts above ``threshold`` characters go to the worker process, the others to a
        thread. A worker that dies raises, and the next call starts a fresh one.
        """
        args = (text, is_json, schedule_json, blocking_power)
        if len(text) <= self.threshold:
            return await asyncio.to_thread(parse_profile_doc, *args)
        if self._pool is None:
            self._pool = ProcessPoolExecutor(1, mp_context=mp.get_context("spawn"))
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._pool, parse_profile_doc, *args)
        except Exception:  # the worker died (killed, out of memory): a fresh one next time
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
            raise

    def close(self) -> None:
        """Shut the worker process down, if one was started."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


class ReportPool:
    """One spawned worker process that decodes large iteration reports.

    See the module docstring.
    """

    def __init__(self, decode_bytes: Callable[[bytes], IterationReport]) -> None:
        """Set up the pool; its worker decodes with ``decode_bytes``.

        ``decode_bytes``: a module-level function (it runs in the worker) from a serialized
        ``IterationReport`` to the service's value, measurements as columns.
        """
        self.decode_bytes = decode_bytes
        self._pool: ProcessPoolExecutor | None = None

    async def decode(
        self, serialize: Callable[[], bytes], fallback: Callable[[], IterationReport]
    ) -> IterationReport:
        """``serialize()`` decoded in the worker; ``fallback()`` when the worker fails.

        Both ``serialize()`` and ``fallback()`` run on a thread.
        """
        data = await asyncio.to_thread(serialize)
        if self._pool is None:
            self._pool = ProcessPoolExecutor(1, mp_context=mp.get_context("spawn"))
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._pool, self.decode_bytes, data)
        except Exception:  # the worker died (killed, out of memory): a fresh one next time
            self.close()
            return await asyncio.to_thread(fallback)

    def close(self) -> None:
        """Shut the worker process down, if one was started."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
