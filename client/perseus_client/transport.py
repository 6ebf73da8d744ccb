"""The client's network side: one rank's link to the server, its channel and its two threads.

:class:`ServerLink` owns one gRPC channel (to the address it uses now;
:mod:`perseus_client.channels`) and two daemon threads:

- the *watcher* (:mod:`perseus_client.plan_watch`) registers the rank, holds ``WatchPlan`` open
  and hands every plan to a callback; when the stream breaks it reconnects with backoff, and
  given several addresses (an active/standby pair; :mod:`perseus_client.addresses`) it follows
  the leader. :meth:`ServerLink.unreachable_for` says how long the server has been unreachable
  (0 while the stream is up), which the client compares with its fail-open timeout. The rank
  keeps its registration, incarnation and report sequence numbers across servers: the new
  leader, on the same database, knows them;
- the *reporter* (:mod:`perseus_client.report_sender`) sends the queued iteration records in
  batches, retrying what could not be sent.

Nothing here ever blocks the training thread: it only appends to a deque.

A bearer token sent without TLS to an address other than loopback can be read by anyone on the
path: :class:`ServerLink` logs one warning when it is created that way
(:func:`credential_in_clear`; names other than ``localhost`` are not resolved, so a host name of
this machine also warns).
"""

from __future__ import annotations

import itertools
import logging
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from perseus_client.addresses import (
    TLS_CA_ENV,
    Endpoint,
    Resolver,
    Route,
    ServerAddress,
    check_target,
    credential_in_clear,
    is_loopback_target,
    parse_servers,
    parse_target,
    read_ca_file,
    read_tls_ca,
    system_resolver,
    tls_context,
)
from perseus_client.channels import open_channel
from perseus_client.measurements import IterationMeasurement
from perseus_client.plan_watch import LEADER_METADATA, PlanWatcher, leader_hint
from perseus_client.report_sender import DUPLICATE_LOG_INTERVAL, ReportSender
from perseus_common.proto import perseus_pb2_grpc
from perseus_common.wire.codec import encode_finish
from perseus_common.wire.values import FinishRank, PlanUpdate, RankRegistration

__all__ = [
    "LEADER_METADATA",
    "ServerLink",
    "leader_hint",
    "parse_target",
    "is_loopback_target",
    "credential_in_clear",
    "read_ca_file",
    "read_tls_ca",
    "check_target",
    "tls_context",
    "TLS_CA_ENV",
]

log = logging.getLogger("perseus_client.transport")


class ServerLink(PlanWatcher, ReportSender):
    """Registration, plan subscription and reporting for one rank (see the module docstring)."""

    def __init__(
        self,
        target: str | Sequence[ServerAddress],
        identity: RankRegistration,
        on_plan: Callable[[PlanUpdate], None],
        *,
        token: str | None = None,
        tls: bool = False,
        root_certificates: bytes | None = None,
        rpc_timeout: float = 5.0,
        backoff_initial: float = 0.1,
        backoff_max: float = 5.0,
        report_interval: float = 0.5,
        max_queued: int = 10_000,
        resolver: Resolver | None = system_resolver,
    ) -> None:
        if isinstance(target, str):
            addresses = (
                parse_servers(target, tls_default=tls)
                if "," in target
                else (ServerAddress(target.strip(), tls),)
            )
        else:
            addresses = tuple(target)
        #: The addresses it was given, and the one it uses now (:mod:`perseus_client.addresses`).
        self.route = Route(addresses, resolver)
        self.identity = identity
        self._on_plan = on_plan
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        for a in addresses:
            if credential_in_clear(a.target, tls=a.tls, token=token):
                log.warning(
                    "perseus: sending the token to %s without TLS: anyone on the network path "
                    "can read it (use grpcs://%s, or a loopback address)",
                    a.target,
                    a.target,
                )
        self._roots = root_certificates
        self._several = self.route.size > 1 or len(addresses) > 1
        self._lock = threading.Lock()
        self._endpoint = self.route.current
        self._channel = self._open(self._endpoint)
        self._stub = perseus_pb2_grpc.PlanServiceStub(self._channel)
        self.rpc_timeout = rpc_timeout
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.report_interval = report_interval
        # (sequence, record): the sequence is the report's idempotency key, fixed when queued so
        # a re-sent report carries the same one. The server compares it only with the sequences
        # of this incarnation (a random id of this process), so a restarted rank is never muted
        # by its previous run's numbers, whatever the clocks say; it starts at the clock in
        # microseconds all the same, for servers that predate incarnations.
        self._queue: deque[tuple[int, IterationMeasurement]] = deque(maxlen=max_queued)
        #: This client's incarnation (1..2^63-1), sent with every report.
        self.incarnation = secrets.randbits(63) or 1
        #: What reports say of the plan's power floors (``set_power_floor``; None: nothing).
        self.power_floor: tuple[str, str, float] | None = None
        self._sequence = itertools.count(max(time.time_ns() // 1000, 1))
        #: Reports the server acknowledged as duplicates (re-sent ones, or muted).
        self.duplicates = 0
        self._duplicates_logged_at = -DUPLICATE_LOG_INTERVAL
        self._reregister = threading.Event()
        self._replaced_logged = False
        self._stop = threading.Event()
        self._call: Any = None
        #: rank id the server gave at the last registration (``None`` before the first).
        self.rank_id: str | None = None
        #: The newest plan version handed on: an older one (a server that lags) is dropped.
        self.known_version = 0
        #: Times it moved to another address (unreachable, or a standby answered).
        self.switches = 0
        #: The leader a standby named last (``host:port``; ``None`` before any).
        self.leader_hint: str | None = None
        self._subscribed = False
        self._ever_up = False
        self._up = False
        self._down_since = time.monotonic()
        self.reconnects = 0
        self.reports_sent = 0
        self.last_error: str | None = None
        self._registered = threading.Event()
        self._watcher = threading.Thread(target=self._watch_loop, name="perseus-watch", daemon=True)
        self._reporter = threading.Thread(
            target=self._report_loop, name="perseus-report", daemon=True
        )

    def start(self) -> None:
        """Start the plan watcher and the reporter threads."""
        self._watcher.start()
        self._reporter.start()

    # -- state --------------------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        """True while the rank is registered and its WatchPlan stream is open."""
        return self._up

    def unreachable_for(self) -> float:
        """Seconds since the server was last reachable (0 while connected)."""
        return 0.0 if self._up else time.monotonic() - self._down_since

    def wait_registered(self, timeout: float) -> bool:
        """Block until the first successful registration (tests and tools; never the hot path)."""
        return self._registered.wait(timeout)

    @property
    def target(self) -> str:
        """The gRPC target it uses now (one of the addresses it was given, or the leader's)."""
        return self._endpoint.target

    def _open(self, endpoint: Endpoint) -> grpc.Channel:
        """A channel to ``endpoint`` (:func:`~perseus_client.channels.open_channel`)."""
        return open_channel(endpoint, root_certificates=self._roots, several=self._several)

    def _use(self, endpoint: Endpoint) -> None:
        """Talk to ``endpoint`` from now on (a new channel; the old one is closed)."""
        if endpoint == self._endpoint:
            return
        channel = self._open(endpoint)
        with self._lock:
            old, self._channel, self._endpoint = self._channel, channel, endpoint
            self._stub = perseus_pb2_grpc.PlanServiceStub(channel)
        old.close()
        self.switches += 1
        log.info("perseus: trying the server at %s", endpoint)

    def _set_up(self) -> None:
        if not self._up:
            self._up = True
            log.info("perseus: connected to %s as rank %s", self.target, self.rank_id)

    def _set_down(self, why: str) -> None:
        if self._up:
            self._up = False
            self._down_since = time.monotonic()
            log.warning(
                "perseus: lost the plan stream from %s (%s); reconnecting", self.target, why
            )

    # -- shutdown -----------------------------------------------------------------------------------

    def finish(self, timeout: float = 1.0) -> bool:
        """Tell the server this rank's training ended cleanly; returns whether the server heard it.

        ``FinishRank``; bounded by ``timeout``, never raises.
        """
        if self.rank_id is None:
            return False
        try:
            self._stub.FinishRank(
                encode_finish(FinishRank(self.identity.job_id, self.rank_id)),
                timeout=timeout,
                metadata=self._metadata,
            )
        except grpc.RpcError as e:
            log.info("perseus: could not tell the server this rank finished: %s", e.code())
            return False
        return True

    def close(self, *, flush_timeout: float = 1.0) -> None:
        """Send what is queued (bounded by ``flush_timeout``), then stop the threads."""
        self._stop.set()
        if self._reporter.is_alive():
            self._reporter.join(timeout=flush_timeout + 1.0)
        if self._up and self._queue:
            self.flush(timeout=flush_timeout)
        with self._lock:
            if self._call is not None:
                self._call.cancel()
        self._channel.close()
        if self._watcher.is_alive():
            self._watcher.join(timeout=2.0)
