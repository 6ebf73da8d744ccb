"""Fixtures of the integration tests.

One real ``perseus serve`` shared by the whole directory. The launcher that runs rank worker
scripts as real processes over gloo is ``integration_harness.run_ranks``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


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
