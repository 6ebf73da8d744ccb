"""The rank's *reporter*: queued iteration records sent in batches, each with its sequence number.

The part of :class:`~perseus_client.transport.ServerLink` that runs on its ``perseus-report``
thread: it sends the queued :class:`~perseus_client.measurements.IterationMeasurement` records
every ``report_interval`` seconds as one ``ReportIterations`` call. Records that could not be sent
stay queued (at most ``max_queued``, oldest dropped first) and are retried. Each record's
sequence number (its idempotency key, with the client's incarnation) is fixed when it is queued,
so a re-sent batch carries the same ones and the server counts nothing twice. The training
thread only appends to a deque.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from typing import Any

import grpc

from perseus_client.measurements import IterationMeasurement
from perseus_client.reports import report_message
from perseus_common.wire.codec import decode_ack
from perseus_common.wire.values import RankRegistration

__all__ = ["DUPLICATE_LOG_INTERVAL", "ReportSender"]

#: Seconds between two warnings about reports the server called duplicates.
DUPLICATE_LOG_INTERVAL = 60.0

log = logging.getLogger("perseus_client.transport")

_BATCH = 256


class ReportSender:
    """The reporter's queue, batches and loop (see the module docstring); its state is the link's."""

    identity: RankRegistration
    rank_id: str | None
    incarnation: int
    power_floor: tuple[str, str, float] | None
    duplicates: int
    reports_sent: int
    rpc_timeout: float
    backoff_max: float
    report_interval: float
    _stub: Any
    _metadata: tuple[tuple[str, str], ...]
    _queue: deque[tuple[int, IterationMeasurement]]
    _sequence: itertools.count[int]
    _duplicates_logged_at: float
    _stop: threading.Event
    _reregister: threading.Event
    _up: bool

    def _register(self) -> None:
        raise NotImplementedError

    def set_power_floor(self, state: tuple[str, str, float] | None) -> None:
        """Whether the GPU holds the plan's floors (any thread): reports carry it from now on.

        ``(state, reason, plan_swing)`` (:func:`perseus_client.gpu.floors.floor_state`); None:
        the plan has no floors.
        """
        self.power_floor = state

    def submit(self, record: IterationMeasurement) -> None:
        """Queue an iteration record (training thread: one deque append)."""
        self._queue.append((next(self._sequence), record))

    @property
    def queued(self) -> int:
        """Records waiting to be sent."""
        return len(self._queue)

    def _to_proto(self, item: tuple[int, IterationMeasurement]) -> Any:
        ident = self.identity
        return report_message(
            item[1],
            job_id=ident.job_id,
            rank_id=self.rank_id or "",
            sequence=item[0],
            incarnation=self.incarnation,
            clock_control=ident.clock_control,
            clock_control_reason=ident.clock_control_reason,
            power_floor=self.power_floor,
        )

    def flush(self, timeout: float | None = None) -> bool:
        """Send everything queued now; True when the queue was emptied.

        A registration the rank owes (its clock control or GPU changed) goes first, so the server
        never reads a report's new clock control beside the clocks of the old registration (the
        last reports, sent at close, included).
        """
        if self._queue and self._reregister.is_set() and self.rank_id is not None:
            self._update_registration()
        while self._queue and self.rank_id is not None:
            batch: list[tuple[int, IterationMeasurement]] = []
            while self._queue and len(batch) < _BATCH:
                batch.append(self._queue.popleft())
            try:
                msgs = [self._to_proto(r) for r in batch]
                ack = self._stub.ReportIterations(
                    iter(msgs), timeout=timeout or self.rpc_timeout, metadata=self._metadata
                )
                self.reports_sent += len(batch)
                duplicates = decode_ack(ack).duplicates
                if duplicates:
                    self._count_duplicates(duplicates, len(batch))
            except grpc.RpcError as exc:
                code = exc.code() if hasattr(exc, "code") else None
                if code == grpc.StatusCode.INVALID_ARGUMENT:
                    log.error(
                        "perseus: the server rejected %d iteration reports: %s",
                        len(batch),
                        exc.details(),
                    )
                    continue
                self._queue.extendleft(reversed(batch))
                return False
            except Exception:  # noqa: BLE001
                log.exception("perseus: could not build iteration reports; dropping %d", len(batch))
        return not self._queue

    def _count_duplicates(self, n: int, sent: int) -> None:
        """The server called ``n`` of ``sent`` reports duplicates: count them, and log it.

        Logged at most once a minute (a re-sent batch is normal; a rank whose every report
        is one is muted).
        """
        self.duplicates += n
        now = time.monotonic()
        if now - self._duplicates_logged_at >= DUPLICATE_LOG_INTERVAL:
            self._duplicates_logged_at = now
            log.warning(
                "perseus: the server dropped %d of %d iteration reports as duplicates "
                "(%d so far; incarnation %d)",
                n,
                sent,
                self.duplicates,
                self.incarnation,
            )

    def _update_registration(self) -> None:
        """Register again with the identity and clock control as they are now."""
        try:
            self._register()
        except grpc.RpcError as exc:
            log.debug("perseus: could not update the registration: %s", exc)
            if self._up:  # else the watcher registers again when it reconnects
                self._reregister.set()

    def _report_loop(self) -> None:
        backoff = self.report_interval
        while not self._stop.wait(backoff):
            if self._reregister.is_set() and self.rank_id is not None:
                self._update_registration()
            if not self._queue or self.rank_id is None:
                continue
            backoff = self.report_interval if self.flush() else min(backoff * 2.0, self.backoff_max)
