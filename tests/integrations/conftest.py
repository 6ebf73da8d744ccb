"""Fixtures of the integration tests.

One real ``perseus serve`` shared by the whole directory, and a launcher that runs rank worker
scripts as real processes over gloo.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from integration_harness import launch_ranks

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def perseus_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from perseus_server.testing.process import ServerProcess

    db = tmp_path_factory.mktemp("integrations-server") / "perseus.db"
    server = ServerProcess(db)
    server.start()
    try:
        yield server
    finally:
        server.close()


def run_ranks(
    script: str, world: int, config: dict[str, Any], out: Path, timeout: float = 240.0
) -> None:
    """Run ``world`` copies of ``script`` (one per rank) to completion; fail with their output."""
    launch_ranks(HERE / script, world, config, out, timeout)
