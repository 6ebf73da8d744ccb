"""What every part of the service shares.

The store, the limits, the jobs, the plan hub, the solve manager and the metrics (one explicit
object, passed to each part; no globals).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from perseus_server.config import Limits
from perseus_server.domain.store import Store
from perseus_server.metrics import Metrics
from perseus_server.runtime.hub import PlanHub
from perseus_server.runtime.solve_manager import SolveManager
from perseus_server.service.state import JobTable

__all__ = ["ServiceContext"]


@dataclass
class ServiceContext:
    """The shared parts of one :class:`~perseus_server.service.PerseusService`."""

    store: Store
    limits: Limits
    jobs: JobTable
    hub: PlanHub
    solver: SolveManager
    metrics: Metrics
    _background: set[asyncio.Task[None]] = field(default_factory=set)

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` on the event loop, holding a reference until it is done."""
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
