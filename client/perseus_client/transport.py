"""The client's network side: registration, the WatchPlan stream and batched reports.

:class:`ServerLink` owns one gRPC channel (to the address it uses now) and two daemon threads:

- the *watcher* registers the rank (``RegisterRank``), then holds ``WatchPlan`` open and hands
  every :class:`~perseus_common.wire.values.PlanUpdate` to a callback, never one older than a version it
  handed on already. When the stream breaks (server down or restarting) it re-registers and
  re-subscribes with exponential backoff and jitter (``backoff_initial`` doubling up to
  ``backoff_max``). :meth:`ServerLink.unreachable_for` says how long the server has been
  unreachable (0 while the stream is up), which the client compares with its fail-open timeout;
- given several addresses (an active/standby pair; :mod:`perseus_client.addresses`), the
  watcher **follows the leader**: when the server it uses is unreachable, hangs past the RPC
  timeout, or answers as a standby (``UNAVAILABLE`` with the leader's address in the trailing
  metadata ``perseus-leader``), it moves to the leader the standby named, else to the next
  address, at once; after a whole round without a leader it waits the backoff (at most
  1 s while a standby says the leader is being replaced). The rank keeps its registration,
  incarnation and report sequence numbers: the new leader, on the same database, knows them;
- the *reporter* sends queued :class:`~perseus_client.measurements.IterationMeasurement` records
  every ``report_interval`` seconds as one ``ReportIterations`` call. Records that could not be
  sent stay queued (at most ``max_queued``, oldest dropped first) and are retried.

Nothing here ever blocks the training thread: it only appends to a deque.

A bearer token sent without TLS to an address other than loopback can be read by anyone on the
path: :class:`ServerLink` logs one warning when it is created that way
(:func:`credential_in_clear`; names other than ``localhost`` are not resolved, so a host name of
this machine also warns).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import random
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import grpc

# gRPC imports its channel module on the first ``insecure_channel`` / ``secure_channel`` call; a
# rank constructed after its process dropped privileges could not read it then (see
# :mod:`perseus_client.connect`), so it is imported now.
from grpc import _channel  # noqa: F401

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
from perseus_client.measurements import IterationMeasurement
from perseus_client.plan import received_plan
from perseus_client.reports import report_message
from perseus_common.proto import perseus_pb2_grpc
from perseus_common.wire.codec import (
    decode_ack,
    decode_plan,
    decode_registered,
    encode_finish,
    encode_plan_request,
    encode_registration,
)
from perseus_common.wire.values import FinishRank, PlanRequest, PlanUpdate, RankRegistration

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

_DUPLICATE_LOG_INTERVAL = 60.0  # seconds between two warnings about reports called duplicates

log = logging.getLogger("perseus_client.transport")

_CHANNEL_OPTIONS = [
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    # How long a ping's answer is awaited: 60 s by default in gRPC core, whatever
    # keepalive_timeout_ms says (a hung server was noticed after ~70 s, not 15 s).
    ("grpc.http2.ping_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2_000),
]
_BATCH = 256
#: What the leader answers when it will not serve this rank: retrying elsewhere would not help.
_REFUSALS = (
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED,
)
#: The longest wait between two rounds while a standby says the leader is being replaced (s).
_STANDBY_RETRY = 1.0
#: The trailing metadata key in which a standby names the leader's gRPC address.
LEADER_METADATA = "perseus-leader"


def leader_hint(exc: grpc.RpcError) -> str | None:
    """The leader's address a standby named in its answer's trailing metadata.

    ``None`` when the answer is not a standby's; ``""`` for a standby that knows no leader yet.
    """
    try:
        trailing: Any = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
    except Exception:  # noqa: BLE001 - an answer without metadata
        return None
    for item in trailing or ():
        key, value = item[0], item[1]
        if key == LEADER_METADATA:
            return value.decode() if isinstance(value, bytes) else str(value)
    return None


class ServerLink:
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
        self._duplicates_logged_at = -_DUPLICATE_LOG_INTERVAL
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
        """A channel to ``endpoint``; a resolved address keeps its name as the TLS authority."""
        opts: dict[str, Any] = dict(_CHANNEL_OPTIONS)
        if self._several:
            # A leader that hangs (stopped, cut off) is left sooner for the next server: the
            # server accepts a ping every 5 s without data, so 6 s + 3 s is the quickest safe.
            opts.update(
                {
                    "grpc.keepalive_time_ms": 6_000,
                    "grpc.keepalive_timeout_ms": 3_000,
                    "grpc.http2.ping_timeout_ms": 3_000,
                }
            )
        if endpoint.authority is not None:
            opts["grpc.default_authority"] = endpoint.authority
            if endpoint.tls:
                opts["grpc.ssl_target_name_override"] = endpoint.authority.rpartition(":")[0]
        options = list(opts.items())
        if endpoint.tls:
            creds = grpc.ssl_channel_credentials(root_certificates=self._roots)
            return grpc.secure_channel(endpoint.target, creds, options=options)
        return grpc.insecure_channel(endpoint.target, options=options)

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

    # -- watcher ------------------------------------------------------------------------------------

    def _register(self) -> None:
        self._reregister.clear()  # this registration carries the identity as it is now
        resp = self._stub.RegisterRank(
            encode_registration(self.identity), timeout=self.rpc_timeout, metadata=self._metadata
        )
        rank_id = decode_registered(resp).rank_id
        if self.rank_id is not None and rank_id != self.rank_id:
            # The server no longer knew this rank (its job was created again): versions
            # start over with the rank's new registration.
            self.known_version = 0
        self.rank_id = rank_id
        self._registered.set()

    def set_clock_control(
        self, state: str, reason: str, *, gpu_name: str, supported_clocks: tuple[int, ...]
    ) -> None:
        """The rank's clock control changed (any thread): reports carry it from now on.

        The rank registers again when its GPU's name or clocks became known.
        """
        self.identity = dataclasses.replace(
            self.identity,
            gpu_name=gpu_name,
            supported_clocks_mhz=supported_clocks,
            clock_control="active" if state == "active" else "unavailable",
            clock_control_reason=reason[:256],
        )
        self._reregister.set()

    def set_power_floor(self, state: tuple[str, str, float] | None) -> None:
        """Whether the GPU holds the plan's floors (any thread): reports carry it from now on.

        ``(state, reason, plan_swing)`` (:func:`perseus_client.gpu.floors.floor_state`); None:
        the plan has no floors.
        """
        self.power_floor = state

    def _stream(self) -> None:
        """Register, subscribe, and hand on every plan until the stream ends (or raise)."""
        self._register()
        call = self._stub.WatchPlan(
            encode_plan_request(
                PlanRequest(self.identity.job_id, self.rank_id or "", self.known_version)
            ),
            metadata=self._metadata,
        )
        with self._lock:
            self._call = call
        if self._stop.is_set():
            call.cancel()
            return
        self._subscribed = True
        if self._ever_up:
            self.reconnects += 1
        self._ever_up = True
        self._set_up()
        for update in call:
            plan = received_plan(decode_plan(update))
            if plan.version < self.known_version:
                # A server behind the one that sent the newer version: never go back.
                log.warning(
                    "perseus: %s sent plan version %d after version %d; ignored",
                    self._endpoint,
                    plan.version,
                    self.known_version,
                )
                continue
            self.known_version = plan.version
            self._on_plan(plan)
        self._set_down("the server closed the stream")

    def _failed(self, exc: grpc.RpcError) -> str:
        """What a failed call means for the watcher.

        Returns:
            ``"refused"`` (stay: the leader said no), ``"replaced"`` (stay, slowly) or
            ``"move"`` (the next address: unreachable, hung, or a standby).
        """
        code = exc.code() if hasattr(exc, "code") else None
        details = exc.details() if hasattr(exc, "details") else str(exc)
        self.last_error = f"{getattr(code, 'name', code)}: {details}"
        self._set_down(self.last_error)
        if code in _REFUSALS:
            log.error(
                "perseus: the server refused rank %s: %s",
                self.identity.global_rank,
                self.last_error,
            )
            return "refused"
        if code == grpc.StatusCode.ABORTED and "replaced" in str(details):
            # Another stream for this rank took our place: another process runs this rank, or
            # the server saw our reconnect first. Retry, slowly, and say so.
            if not self._replaced_logged:
                self._replaced_logged = True
                log.warning(
                    "perseus: the plan stream of rank %s was replaced by a newer one "
                    "(is another process running this rank?); reconnecting",
                    self.identity.global_rank,
                )
            return "replaced"
        return "move"

    def _watch_loop(self) -> None:
        backoff = self.backoff_initial
        tried = 0  # addresses tried since one served
        standby = False  # a standby answered in this round: the leader is being replaced
        while not self._stop.is_set():
            self._subscribed = False
            action, hint = "stay", None
            try:
                self._stream()
            except grpc.RpcError as exc:
                if self._stop.is_set():
                    break
                action = self._failed(exc)
                hint = leader_hint(exc)
            except Exception as exc:  # noqa: BLE001 - the watcher must survive anything
                self.last_error = repr(exc)
                log.exception("perseus: plan watcher error")
                self._set_down(self.last_error)
            finally:
                with self._lock:
                    self._call = None
            if self._subscribed:
                backoff, tried, standby = self.backoff_initial, 0, False
            wait, grow = backoff, True
            if action == "replaced":
                wait = self.backoff_max
            elif action == "move":
                if hint is not None:
                    standby = True
                    self.leader_hint = hint or self.leader_hint
                self._use(self.route.advance(hint or None))
                tried += 1
                if tried < self.route.size:
                    wait, grow = self.backoff_initial, False  # the rest of the round, at once
                else:
                    wait = min(backoff, _STANDBY_RETRY) if standby else backoff
                    tried, standby = 0, False
            if self._stop.wait(wait * random.uniform(0.5, 1.0)):
                break
            if grow:
                backoff = min(backoff * 2.0, self.backoff_max)

    # -- reporter -----------------------------------------------------------------------------------

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
        """Send everything queued now; True when the queue was emptied."""
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
        if now - self._duplicates_logged_at >= _DUPLICATE_LOG_INTERVAL:
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
