"""The path one iteration report takes through the server's modules.

From the gRPC entry (``PlanServicer.ReportIterations``) to the last observer, traced with
:func:`sys.setprofile`.

The report is followed as a parameter: every call of a function of the project's modules
(``perseus_server``, ``perseus_common``, ``perseus``) that receives it (the wire message, the
decoded :class:`~perseus_common.wire.values.IterationReport`, or the checked report the
observers take) is recorded with its module. A *stop* is a run of such calls in one module; a
*return* is a stop in a module the report had left before (a module reached again, not a
function returning). The report is handled in-process by a real service over a real store (a
job with a deployed plan, as the first release stored it), through the real servicer, with a
stand-in for the gRPC stream and context.

``python -m tests.server.report_path`` prints the stops and the counts (the numbers of
``docs/results/2026-12-02-structure.md``); ``tests/server/service/test_reports_path.py`` checks them.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from perseus_common.proto import perseus_pb2 as pb
from perseus_common.wire.values import IterationReport
from perseus_server.config import Limits
from perseus_server.grpc.report_decoder import decode_report_bytes
from perseus_server.grpc.service import PlanServicer
from perseus_server.runtime.sql_store import SqlStore
from perseus_server.service import PerseusService

from .conftest import sliced_profile_csv
from .sqlite_backend import JOB, RANK, VERSION, first_release_database

__all__ = ["Trace", "trace_report"]

OURS = ("perseus_server", "perseus_common", "perseus")


@dataclass
class Trace:
    """The stops of one report's path, in order (module names)."""

    stops: list[str] = field(default_factory=list)
    #: Every call that received the report: ``module.function``.
    calls: list[str] = field(default_factory=list)

    @property
    def modules(self) -> int:
        return len(set(self.stops))

    @property
    def returns(self) -> int:
        """Stops in a module the path had left before."""
        return len(self.stops) - self.modules

    def visits(self) -> Counter[str]:
        return Counter(self.stops)


def _carriers() -> tuple[type, ...]:
    """The types a report travels as.

    The wire message, the domain value, the checked report (in ``service/observers.py`` since
    the report pipeline, in ``service/reports.py`` before).
    """
    import perseus_server.service.reports as reports

    types: list[type] = [pb.IterationReport, IterationReport]
    try:
        from perseus_server.service import observers
    except ImportError:  # the tree before the report pipeline
        types.append(reports.CheckedReport)
    else:
        types.append(observers.CheckedReport)
    return tuple(types)


def _carries(frame: FrameType, carriers: tuple[type, ...]) -> bool:
    """Whether the called function received the report among its arguments.

    Or an object holding it (the adapter's wrapper of the wire message).
    """
    code = frame.f_code
    n = code.co_argcount + code.co_kwonlyargcount
    for a in code.co_varnames[:n]:
        v = frame.f_locals.get(a)
        if isinstance(v, carriers):
            return True
        if isinstance(v, (list, tuple)) and any(isinstance(x, carriers) for x in v):
            return True
        held = _fields(v) if type(v).__module__.split(".")[0] in OURS else ()
        if any(isinstance(x, carriers) for x in held):
            return True
    return False


def _fields(obj: object) -> list[object]:
    """The values an object of ours holds: its ``__dict__``'s, or its slots' (those set)."""
    if hasattr(obj, "__dict__"):
        return list(vars(obj).values())
    slots = [s for c in type(obj).__mro__ for s in getattr(c, "__slots__", ())]
    return [getattr(obj, s) for s in slots if hasattr(obj, s)]


class _Context:
    """What the servicer asks of a gRPC context on the accepted path."""

    def invocation_metadata(self) -> tuple[()]:
        return ()

    async def abort(self, code: Any, detail: str) -> None:  # pragma: no cover - not reached
        raise RuntimeError(f"{code}: {detail}")


async def _stream(report: pb.IterationReport) -> AsyncIterator[pb.IterationReport]:
    yield report


def _report(mhz: int) -> pb.IterationReport:
    """A report as a rank sends it: measurements, transfers, energy, clock samples."""
    return pb.IterationReport(
        job_id=JOB,
        rank_id=RANK,
        iteration=9,
        iteration_time=1.5,
        plan_version=VERSION,
        energy=300.0,
        sequence=1,
        instructions=[
            pb.InstructionMeasurement(
                instruction=kind, microbatch=mb, frequency_mhz=mhz, time=0.02, energy=4.0
            )
            for mb in range(4)
            for kind in ("forward", "backward")
        ],
        transfers=[
            pb.TransferMeasurement(boundary=0, direction="forward", microbatch=mb, time=0.001)
            for mb in range(4)
        ],
    )


def trace_report(tmp: Path, *, every_call: bool = False) -> Trace:
    """Handle one report through ``ReportIterations`` and trace its stops.

    ``every_call``: trace every call of a project function while the report is handled, whatever
    its arguments (how scattered the handling is, helpers on the job's state included).
    """
    tmp.mkdir(parents=True, exist_ok=True)
    csv = sliced_profile_csv()
    first_release_database(tmp / "perseus.db", csv)
    store = SqlStore.open(tmp / "perseus.db")
    try:
        service = PerseusService(store, Limits(), report_decoder=decode_report_bytes)
        service.load()
        servicer = PlanServicer(service, None)
        profile = service.jobs.get(JOB).profile.current
        assert profile is not None
        report = _report(max(profile.frequencies))
        # A report before the traced one, so that the traced one finds its rank's state made.
        warm = pb.IterationReport()
        warm.CopyFrom(report)
        warm.iteration, warm.sequence = 8, 0
        asyncio.run(servicer.ReportIterations(_stream(warm), _Context()))  # type: ignore[arg-type]
        trace = Trace()

        carriers = _carriers()

        def hook(frame: FrameType, event: str, arg: Any) -> None:
            if event != "call":
                return
            mod = str(frame.f_globals.get("__name__", ""))
            if mod.split(".")[0] not in OURS:
                return
            if not every_call and not _carries(frame, carriers):
                return
            trace.calls.append(f"{mod}.{frame.f_code.co_qualname}")
            if not trace.stops or trace.stops[-1] != mod:
                trace.stops.append(mod)

        async def handle() -> pb.ReportAck:
            sys.setprofile(hook)
            try:
                return await servicer.ReportIterations(_stream(report), _Context())  # type: ignore[arg-type]
            finally:
                sys.setprofile(None)

        ack = asyncio.run(handle())
        assert ack.accepted == 1, ack
        return trace
    finally:
        store.close()


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        everything = trace_report(Path(tmp) / "all", every_call=True)
    print(
        f"every call: {len(everything.stops)} stops in {everything.modules} modules, "
        f"{everything.returns} returns, {len(everything.calls)} calls"
    )
    with tempfile.TemporaryDirectory() as tmp:
        trace = trace_report(Path(tmp))
    print(
        f"the report: {len(trace.stops)} stops in {trace.modules} modules, {trace.returns} returns"
    )
    print("| module | visits |\n|---|---|")
    for mod, n in trace.visits().most_common():
        print(f"| `{mod}` | {n} |")
    print("\npath: " + " -> ".join(m.removeprefix("perseus_server.") for m in trace.stops))
    print("\ncalls: " + ", ".join(c.removeprefix("perseus_server.") for c in trace.calls))


if __name__ == "__main__":
    main()
