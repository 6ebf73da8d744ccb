"""An iteration report's path from the gRPC entry to the last observer goes forward.

Decoded, checked, stored, then handed to each observer in the registered order, never back into a
module it has left but for the one callback of the adapter's decoder (the service decides where a
report is decoded; see ``tests/server/report_path.py`` for how the path is traced).
"""

from __future__ import annotations

from pathlib import Path

from ..report_path import trace_report

#: The modules of the observers, in the order the service registers them.
OBSERVER_MODULES = [
    "service.observers",
    "service.clock_verification",
    "service.measured_power",
    "service.stragglers",
    "service.slow_links",
    "service.slow_stages",
    "service.online_profiling",
]


def test_a_report_goes_forward_to_every_observer(tmp_path: Path) -> None:
    path = [m.removeprefix("perseus_server.") for m in trace_report(tmp_path).stops]
    assert path[:2] == ["grpc.received", "service.facade"], path
    stages = [
        "perseus_common.wire.codec",
        "service.report_checks",
        "service.reports",
        *OBSERVER_MODULES,
    ]
    assert [m for m in path if m in stages] == stages, path
    revisited = [m for i, m in enumerate(path) if m in path[:i]]
    # forward only: the service decodes with the codec's function the adapter bound, and never
    # calls back into the adapter (it did, for the report's size and decode, until 2026-12-02)
    assert revisited == [], path
