"""The client's network side: registration, the WatchPlan stream and batched reports.

:class:`ServerLink` owns one gRPC channel and two daemon threads:

- the *watcher* registers the rank (``RegisterRank``), then holds ``WatchPlan`` open and hands
  every :class:`~perseus_client.plan.Plan` to a callback. When the stream breaks (server down or
  restarting) it re-registers and re-subscribes with exponential backoff and jitter
  (``backoff_initial`` doubling up to ``backoff_max``). :meth:`ServerLink.unreachable_for` says
  how long the server has been unreachable (0 while the stream is up), which the client compares
  with its fail-open timeout;
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
import ipaddress
import itertools
import logging
import os
import random
import secrets
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import grpc

from perseus_client.errors import ConfigError
from perseus_client.measurements import IterationMeasurement
from perseus_client.plan import Plan
from perseus_client.reports import report_message
from perseus_common.proto import perseus_pb2_grpc
from perseus_common.wire import FinishRank, PlanRequest, RankRegistration
from perseus_common.wire.codec import (
    decode_ack,
    decode_registered,
    encode_finish,
    encode_plan_request,
    encode_registration,
)

__all__ = [
    "RankIdentity",
    "ServerLink",
    "parse_target",
    "is_loopback_target",
    "credential_in_clear",
    "read_ca_file",
    "read_tls_ca",
    "check_target",
    "tls_context",
    "TLS_CA_ENV",
]

#: The environment variable naming a PEM file of the CA that signed the server's certificate.
TLS_CA_ENV = "PERSEUS_TLS_CA"
_DUPLICATE_LOG_INTERVAL = 60.0  # seconds between two warnings about reports called duplicates

log = logging.getLogger("perseus_client.transport")

_CHANNEL_OPTIONS = [
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2_000),
]
_BATCH = 256


RankIdentity = RankRegistration
"""What the rank tells the server at registration: the wire's :class:`RankRegistration` (its
clock control included; ``max_power_limit_w`` is the cost policy's MAXPOWER)."""


def parse_target(server: str) -> tuple[str, bool]:
    """``host:port``, ``grpc://host:port`` or ``grpcs://host:port`` -> (target, tls)."""
    s = server.strip()
    for prefix, tls in (
        ("grpcs://", True),
        ("grpc://", False),
        ("https://", True),
        ("http://", False),
    ):
        if s.startswith(prefix):
            return s[len(prefix) :].rstrip("/"), tls
    return s, False


_RESOLVER_SCHEMES = ("unix:", "unix-abstract:", "dns:", "ipv4:", "ipv6:", "vsock:")


def check_target(target: str) -> None:
    """Raise :class:`ConfigError` (field ``server``) unless ``target`` is a valid gRPC target.

    Valid: ``host:port`` (a port 1..65535; ``[v6]:port`` for IPv6), or a name of a gRPC resolver
    (``unix:path``, ``dns:///...``).
    """
    t = target.strip()
    if t.startswith(_RESOLVER_SCHEMES):
        return
    host, sep, port = t.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    ok = (
        sep == ":"
        and bool(host)
        and not any(c.isspace() or c in "/?#@" for c in host)
        and (":" not in host or t.startswith("["))
        and port.isdigit()
        and 1 <= int(port) <= 65535
    )
    if not ok:
        raise ConfigError(
            "server",
            f"expected host:port (grpcs://host:port for TLS, [v6 address]:port), got {target!r}",
        )


def read_tls_ca(path: str | os.PathLike[str] | None = None) -> bytes | None:
    """The PEM bytes of the CA file ``path`` (default ``$PERSEUS_TLS_CA``).

    ``None`` when neither is set. Raises :class:`ConfigError` naming the option when the file
    cannot be read or holds no PEM certificate.
    """
    if path is None or not os.fspath(path):
        env = os.environ.get(TLS_CA_ENV) or None
        return None if env is None else read_ca_file(env, TLS_CA_ENV)
    return read_ca_file(path, "tls_ca")


def read_ca_file(path: str | os.PathLike[str], field: str) -> bytes:
    """The PEM bytes of the CA file ``path``.

    Raises :class:`ConfigError` naming ``field`` (the option or variable that gave it) when it
    cannot be read or holds no PEM certificate.
    """
    try:
        with open(path, "rb") as f:
            pem = f.read()
    except OSError as exc:
        raise ConfigError(
            field, f"cannot read the CA file {path!s}: {exc.strerror or exc}"
        ) from exc
    if b"-----BEGIN CERTIFICATE-----" not in pem:
        raise ConfigError(field, f"{path!s} holds no PEM certificate (BEGIN CERTIFICATE)")
    return pem


def tls_context(tls_ca: str | os.PathLike[str] | None = None) -> ssl.SSLContext | None:
    """An SSL context that trusts the CA file ``tls_ca`` (default ``$PERSEUS_TLS_CA``).

    For REST calls: ``httpx.Client(verify=ctx)``, ``urllib.request.urlopen(req, context=ctx)``;
    ``None`` when no CA is configured (use the system's roots). Raises :class:`ConfigError` like
    :func:`read_tls_ca`.
    """
    pem = read_tls_ca(tls_ca)
    if pem is None:
        return None
    ctx = ssl.create_default_context()
    ctx.load_verify_locations(cadata=pem.decode("ascii", errors="replace"))
    return ctx


def is_loopback_target(target: str) -> bool:
    """True when the gRPC ``target`` (``host:port``, ``[v6]:port``, ``unix:path``...) is local.

    Loopback means ``localhost`` (or a ``.localhost`` name), a loopback IP (127.0.0.0/8, ::1) or
    a Unix socket; any other name is not resolved and counts as remote.
    """
    t = target.strip()
    if t.startswith(("unix:", "unix-abstract:")):
        return True
    for scheme in ("dns:///", "dns:", "ipv4:", "ipv6:"):
        if t.startswith(scheme):
            t = t[len(scheme) :]
            break
    if t.startswith("["):
        host = t[1 : t.find("]")] if "]" in t else t[1:]
    elif t.count(":") == 1:
        host = t.rsplit(":", 1)[0]
    else:
        host = t  # no port, or a bare IPv6 address
    host = host.strip().rstrip(".").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def credential_in_clear(target: str, *, tls: bool, token: str | None) -> bool:
    """True when a token would travel without TLS to a non-loopback ``target``."""
    return bool(token) and not tls and not is_loopback_target(target)


class ServerLink:
    """Registration, plan subscription and reporting for one rank (see the module docstring)."""

    def __init__(
        self,
        target: str,
        identity: RankIdentity,
        on_plan: Callable[[Plan], None],
        *,
        token: str | None = None,
        tls: bool = False,
        root_certificates: bytes | None = None,
        rpc_timeout: float = 5.0,
        backoff_initial: float = 0.1,
        backoff_max: float = 5.0,
        report_interval: float = 0.5,
        max_queued: int = 10_000,
    ) -> None:
        self.target = target
        self.identity = identity
        self._on_plan = on_plan
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        if credential_in_clear(target, tls=tls, token=token):
            log.warning(
                "perseus: sending the token to %s without TLS: anyone on the network path can "
                "read it (use grpcs://%s, or a loopback address)",
                target,
                target,
            )
        if tls:
            creds = grpc.ssl_channel_credentials(root_certificates=root_certificates)
            self._channel = grpc.secure_channel(target, creds, options=_CHANNEL_OPTIONS)
        else:
            self._channel = grpc.insecure_channel(target, options=_CHANNEL_OPTIONS)
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
        self._sequence = itertools.count(max(time.time_ns() // 1000, 1))
        #: Reports the server acknowledged as duplicates (re-sent ones, or muted).
        self.duplicates = 0
        self._duplicates_logged_at = -_DUPLICATE_LOG_INTERVAL
        self._reregister = threading.Event()
        self._replaced_logged = False
        self._stop = threading.Event()
        self._call: Any = None
        self._lock = threading.Lock()
        #: rank id the server gave at the last registration (``None`` before the first).
        self.rank_id: str | None = None
        self.known_version = 0
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
        self.rank_id = decode_registered(resp).rank_id
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

    def _watch_loop(self) -> None:
        backoff = self.backoff_initial
        first = True
        while not self._stop.is_set():
            try:
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
                    break
                self._set_up()
                if not first:
                    self.reconnects += 1
                first = False
                backoff = self.backoff_initial
                for update in call:
                    plan = Plan.from_proto(update)
                    self.known_version = plan.version
                    self._on_plan(plan)
                self._set_down("the server closed the stream")
            except grpc.RpcError as exc:
                if self._stop.is_set():
                    break
                code = exc.code() if hasattr(exc, "code") else None
                details = exc.details() if hasattr(exc, "details") else str(exc)
                self.last_error = f"{getattr(code, 'name', code)}: {details}"
                if code in (
                    grpc.StatusCode.INVALID_ARGUMENT,
                    grpc.StatusCode.NOT_FOUND,
                    grpc.StatusCode.UNAUTHENTICATED,
                    grpc.StatusCode.PERMISSION_DENIED,
                ):
                    log.error(
                        "perseus: the server refused rank %s: %s",
                        self.identity.global_rank,
                        self.last_error,
                    )
                elif code == grpc.StatusCode.ABORTED and "replaced" in str(details):
                    # Another stream for this rank took our place: another process runs this
                    # rank, or the server saw our reconnect first. Retry, slowly, and say so.
                    if not self._replaced_logged:
                        self._replaced_logged = True
                        log.warning(
                            "perseus: the plan stream of rank %s was replaced by a newer one "
                            "(is another process running this rank?); reconnecting",
                            self.identity.global_rank,
                        )
                    backoff = self.backoff_max
                self._set_down(self.last_error)
            except Exception as exc:  # noqa: BLE001 - the watcher must survive anything
                self.last_error = repr(exc)
                log.exception("perseus: plan watcher error")
                self._set_down(self.last_error)
            finally:
                with self._lock:
                    self._call = None
            if self._stop.wait(backoff * random.uniform(0.5, 1.0)):
                break
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
