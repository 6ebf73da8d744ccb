"""Which plan a rank runs: the newest received, swapped in at an iteration boundary.

The part of :class:`~perseus_client.PerseusClient` that keeps its plans: the stream hands each
new plan version to :meth:`PlanChoice._receive_plan` (any thread); an offline client is given
one with :meth:`PlanChoice.use_plan`; at every iteration boundary :meth:`PlanChoice._select_plan`
picks the newest, or none (the maximum clock) while the server has been unreachable for longer
than ``FailOpen.server_timeout``. A mismatch between the plan and what the rank runs is logged
once per client.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from perseus_client.errors import PlanMismatchError
from perseus_client.options import FailOpen
from perseus_common.wire.values import PlanUpdate

__all__ = ["PlanChoice"]

log = logging.getLogger("perseus_client")


class PlanChoice:
    """The plans of a client (see the module docstring); its state is the client's."""

    link: Any
    fail_open: FailOpen
    failed_open: bool
    _latest: PlanUpdate | None
    _plan: PlanUpdate | None
    _plan_lock: threading.Lock
    _mismatch_logged: bool

    def _receive_plan(self, plan: PlanUpdate) -> None:
        with self._plan_lock:
            self._latest = plan
        log.debug("perseus: received plan version %d (%s)", plan.version, plan.reason)

    def use_plan(self, plan: PlanUpdate | None) -> None:
        """Use ``plan`` from the next iteration on (offline mode; a server plan overrides it)."""
        with self._plan_lock:
            self._latest = plan

    @property
    def plan(self) -> PlanUpdate | None:
        """The plan of the current (or last) iteration; ``None`` while running at max clocks."""
        return self._plan

    @property
    def latest_plan(self) -> PlanUpdate | None:
        """The newest plan received (used from the next iteration boundary)."""
        return self._latest

    @property
    def plan_version(self) -> int:
        """Version of the plan in use (0: none, max clocks)."""
        return self._plan.version if self._plan is not None else 0

    @property
    def connected(self) -> bool:
        """True while the plan stream to the server is open."""
        return self.link is not None and self.link.connected

    @property
    def rank_id(self) -> str | None:
        """The rank id the server assigned (``None`` offline or before registering)."""
        return self.link.rank_id if self.link is not None else None

    def _select_plan(self) -> PlanUpdate | None:
        link = self.link
        if link is not None and link.unreachable_for() > self.fail_open.server_timeout:
            if not self.failed_open:
                self.failed_open = True
                log.warning(
                    "perseus: server unreachable for more than %.1f s; running at max clocks",
                    self.fail_open.server_timeout,
                )
            return None
        if self.failed_open:
            self.failed_open = False
            log.info("perseus: server reachable again; resuming the plan")
        return self._latest

    def _log_mismatch(self, err: PlanMismatchError) -> None:
        if not self._mismatch_logged:
            self._mismatch_logged = True
            log.warning("perseus: %s; running the rest of the iteration at max clock", err)
