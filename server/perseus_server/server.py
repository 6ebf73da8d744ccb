"""``perseus serve``: FastAPI under uvicorn and a ``grpc.aio`` server on one event loop.

At start, before it listens, the server begins warming the solver's kernels in a child process
(:mod:`perseus_server.runtime.warmup`): ``/healthz`` says ``"kernels": "warming"`` and solves wait
``queued`` until it is done.

Token rotation without a restart: on SIGHUP, and when ``--token-file`` or ``--read-token-file``
changes (checked every :data:`TOKEN_POLL_SECONDS`), both files are read again and the new tokens
replace the old ones at once (a file that cannot be used is logged and the old tokens stay).

Shutdown on SIGTERM/SIGINT: open WatchPlan streams are ended, gRPC stops with a short grace,
uvicorn finishes in-flight requests, running solves are stopped (their jobs are marked failed),
and the SQLite WAL is checkpointed (or the PostgreSQL connections closed).

With PostgreSQL, the server listens at once and then takes the leadership of its database; until
it leads, it answers as a standby, naming the leader (:mod:`perseus_server.standby`), and once it
leads it loads the state and serves on the same ports, without a restart (see
:mod:`perseus_server.runtime.leadership`). It stops with exit status 3 when it loses the lead.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import socket
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import uvicorn

from perseus_server.config import ServerConfig, read_token
from perseus_server.domain.states import StreamEnd
from perseus_server.grpc.gate import GRPC_CODES, GRPC_METHODS, AuthInterceptor
from perseus_server.grpc.report_decoder import decode_report_bytes
from perseus_server.grpc.service import PlanServicer, add_to_server
from perseus_server.rest import create_app
from perseus_server.runtime.connection_limits import GRPC_MAX_MESSAGE, guarded_http, raise_fd_limit
from perseus_server.runtime.leadership import (
    DEPOSED_EXIT,
    Leader,
    NotLeader,
    StoppedWaiting,
    become_leader,
)
from perseus_server.runtime.ports import reserve_port
from perseus_server.runtime.stores import describe, is_postgres, open_store
from perseus_server.runtime.warmup import warm_kernels
from perseus_server.service import PerseusService
from perseus_server.service.credentials import Credentials
from perseus_server.standby import (
    LeaderAddress,
    Standby,
    StandbyGate,
    StandbyInterceptor,
    advertised,
    read_advertised,
)

__all__ = ["TOKEN_POLL_SECONDS", "TokenFiles", "serve"]

log = logging.getLogger("perseus.server")

#: How often the token files are checked for a change (s).
TOKEN_POLL_SECONDS = 2.0


class TokenFiles:
    """The admin and read token files, read again on SIGHUP or when they change."""

    def __init__(self, config: ServerConfig, credentials: Credentials) -> None:
        self.paths = [p for p in (config.token_file, config.read_token_file) if p is not None]
        self.config = config
        self.credentials = credentials
        self._stamp = self._stamps()

    def _stamps(self) -> tuple[tuple[float, int, int], ...]:
        out = []
        for p in self.paths:
            try:
                st = p.stat()
                out.append((st.st_mtime, st.st_size, st.st_ino))
            except OSError:
                out.append((0.0, -1, -1))
        return tuple(out)

    def reload(self, why: str) -> bool:
        """Read the files again; returns whether the tokens now in use are the files'."""
        self._stamp = self._stamps()
        cfg = self.config
        if cfg.token_file is None:
            return False
        try:
            file: Path | None = cfg.token_file
            admin = read_token(cfg.token_file)
            file = cfg.read_token_file
            read = None if file is None else read_token(file)
        except ValueError as e:
            log.error("token files not reloaded (%s): %s: %s; the old tokens stay", why, file, e)
            return False
        if read is not None and read == admin:
            log.error("token files not reloaded (%s): the read token equals the admin token", why)
            return False
        changed = admin != self.credentials.admin or (read,) != (
            self.credentials.read[0] if self.credentials.read else None,
        )
        self.credentials.admin = admin
        self.credentials.read = () if read is None else (read,)
        log.info("token files reloaded (%s)%s", why, "" if changed else ": unchanged")
        return True

    async def watch(self) -> None:
        """Reload whenever a file's modification time, size or inode changes."""
        while True:
            await asyncio.sleep(TOKEN_POLL_SECONDS)
            if self._stamps() != self._stamp:
                self.reload("a token file changed")


class _Uvicorn(uvicorn.Server):
    """uvicorn without its own signal handling (the serve loop owns SIGTERM/SIGINT)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _bind(host: str, port: int) -> socket.socket:
    family, type_, proto, _, addr = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, type_, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(addr)
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def _fmt_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


#: Allocations (less deallocations) between collections of the youngest generation.
GC_YOUNG = 10_000

#: gRPC calls that have arrived but that the event loop has not yet taken up, which gRPC's core
#: keeps waiting (``grpc.server.max_pending_requests``). Past this many it refuses new calls at
#: random, the more the longer the queue and all of them at twice this; a refused call ends
#: ``CANCELLED`` at its client, and the server never sees it (nothing in its log). The loop
#: takes calls up one at a time, so a whole job's ranks opening ``WatchPlan`` at once (a
#: restart or a failover) queue thousands: gRPC's default, 1,000 (3,000 for all), cancelled
#: about one stream in ten of 2,048 opened at once. This is the most ranks a job may have.
GRPC_MAX_PENDING_CALLS = 65_536


def _grpc_server(
    config: ServerConfig,
    service: PerseusService,
    credentials: Credentials,
    max_connections: int,
    standby: StandbyInterceptor | None,
) -> grpc.aio.Server:
    """The gRPC server of :func:`serve`, with its interceptors, options and servicer.

    No port yet. The standby's answers (a server that can be one) come first: nothing else
    runs until it leads.
    """
    service.metrics.grpc_calls.restrict(method=GRPC_METHODS, code=GRPC_CODES)
    grpc_server = grpc.aio.server(
        interceptors=[
            *([] if standby is None else [standby]),
            AuthInterceptor(
                credentials,
                lambda m, code: service.metrics.grpc_calls.inc(method=m, code=code),
            ),
        ],
        options=[
            ("grpc.max_receive_message_length", GRPC_MAX_MESSAGE),
            ("grpc.max_send_message_length", 64 * 1024 * 1024),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_ping_interval_without_data_ms", 5000),
            ("grpc.so_reuseport", 0),
            ("grpc.server_handshake_timeout_ms", int(config.header_timeout * 1000)),
            ("grpc.max_connection_idle_ms", 600_000),
            ("grpc.max_concurrent_streams", 1024),
            ("grpc.server.max_pending_requests", GRPC_MAX_PENDING_CALLS),
            ("grpc.server.max_pending_requests_hard_limit", 2 * GRPC_MAX_PENDING_CALLS),
            ("grpc.max_allowed_incoming_connections", max_connections),
        ],
    )
    add_to_server(PlanServicer(service, credentials if credentials.enabled else None), grpc_server)
    return grpc_server


def _advertise(config: ServerConfig, grpc_port: int, http_port: int, scheme: str) -> str:
    """The addresses stored with the lease, with the ports it listens on.

    The host is ``--advertise``, else the bind address (the host name when it binds every
    address).
    """
    host = config.advertise or (
        socket.gethostname() if config.host in ("0.0.0.0", "::", "") else config.host
    )
    host = _fmt_host(host.strip("[]"))
    return advertised(f"{host}:{grpc_port}", f"{scheme}://{host}:{http_port}")


def _heard(standby: Standby) -> Callable[[str, int, bool, str], None]:
    def heard(holder: str, epoch: int, live: bool, where: str) -> None:
        grpc_address, rest = read_advertised(where)
        standby.heard(LeaderAddress(holder, epoch, grpc_address, rest, live))

    return heard


class _Front:
    """The server's two listeners (gRPC and REST), behind the standby's answers."""

    def __init__(
        self, config: ServerConfig, service: PerseusService, standby: Standby | None
    ) -> None:
        """Build both servers (no port yet).

        Args:
            config: how it runs.
            service: what it serves.
            standby: the standby's answers; ``None`` for a server on its own (SQLite), which
                leads from the start.
        """
        self.config = config
        self.tls = config.tls_cert is not None and config.tls_key is not None
        self.credentials = service.authority(
            config.token, () if config.read_token is None else (config.read_token,)
        )
        fds = raise_fd_limit()
        max_connections = max(16, min(config.max_connections, (fds - 512) // 2))
        self.grpc_server = _grpc_server(
            config,
            service,
            self.credentials,
            max_connections,
            None if standby is None else StandbyInterceptor(standby, self.credentials),
        )
        # The address it listens on is a name its clients use (unless it is every address).
        own = () if config.host in ("0.0.0.0", "::", "") else (config.host,)
        app = create_app(
            service,
            token=config.token,
            credentials=self.credentials,
            allowed_hosts=(*config.allowed_hosts, *own),
            zeus_routes=config.zeus,
        )
        self.uv = _Uvicorn(
            uvicorn.Config(
                app if standby is None else StandbyGate(app, standby, self.credentials),
                http=guarded_http(max_connections, config.header_timeout, config.body_timeout),
                lifespan="off",
                log_level="warning",
                access_log=False,
                ssl_certfile=str(config.tls_cert) if self.tls else None,
                ssl_keyfile=str(config.tls_key) if self.tls else None,
                timeout_graceful_shutdown=max(1, int(config.shutdown_grace)),
                timeout_keep_alive=5,
            )
        )
        self.grpc_port = self.http_port = 0
        self.http_task: asyncio.Task[None] | None = None

    def bind_grpc(self) -> None:
        """Add the gRPC port (OSError when it cannot be had)."""
        config = self.config
        # Port 0 on a name of several addresses: one port free on all of them (else gRPC may
        # listen on the first alone, runtime/ports.py).
        held = reserve_port(config.host) if config.grpc_port == 0 else None
        port = config.grpc_port if held is None else held.port
        try:
            self._add_grpc_port(f"{_fmt_host(config.host)}:{port}")
        finally:
            if held is not None:
                held.release()

    def _add_grpc_port(self, grpc_addr: str) -> None:
        config = self.config
        if self.tls:
            assert config.tls_cert is not None and config.tls_key is not None
            creds = grpc.ssl_server_credentials(
                [(config.tls_key.read_bytes(), config.tls_cert.read_bytes())]
            )
            self.grpc_port = self.grpc_server.add_secure_port(grpc_addr, creds)
        else:
            self.grpc_port = self.grpc_server.add_insecure_port(grpc_addr)
        if self.grpc_port == 0:
            raise OSError(f"cannot listen for gRPC on {grpc_addr}")

    async def start(self, say: Callable[[str], None]) -> bool:
        """Listen on both ports; False when uvicorn could not start."""
        sock = _bind(self.config.host, self.config.http_port)
        self.http_port = sock.getsockname()[1]
        await self.grpc_server.start()
        self.http_task = http_task = asyncio.create_task(self.uv.serve(sockets=[sock]))
        while not self.uv.started and not http_task.done():
            await asyncio.sleep(0.01)
        if http_task.done():
            await self.grpc_server.stop(0)
            http_task.result()
            return False
        host = _fmt_host(self.config.host)
        say(f"perseus: REST listening on {self.scheme}://{host}:{self.http_port}")
        say(f"perseus: gRPC listening on {host}:{self.grpc_port}")
        return True

    @property
    def scheme(self) -> str:
        """``https`` with TLS, else ``http``."""
        return "https" if self.tls else "http"

    async def stop(self, grace: float) -> None:
        """Stop both listeners (in-flight REST requests finish)."""
        await self.grpc_server.stop(grace)
        self.uv.should_exit = True
        if self.http_task is not None:
            with contextlib.suppress(Exception):
                await self.http_task


def _close_store(service: PerseusService, leader: Leader | None) -> None:
    service.store.close()
    if leader is not None:
        leader.close()


async def _lead(
    config: ServerConfig,
    service: PerseusService,
    front: _Front,
    standby: Standby,
    stop: asyncio.Event,
    say: Callable[[str], None],
) -> tuple[bool, Leader | None]:
    """Become the leader (a standby answers meanwhile), load the state and serve it.

    Returns ``(serving, leader)``: ``serving`` is False when ``stop`` was set while it waited.
    """
    try:
        leader = await become_leader(
            service.store,
            config.leader_lease,
            say,
            advertise=_advertise(config, front.grpc_port, front.http_port, front.scheme),
            heard=_heard(standby),
            stop=stop,
        )
    except StoppedWaiting:
        return False, None
    if leader is not None:
        # As the leader: every commit of the epochs before is there; solves cut short resume.
        service.load(resume_solves=True)
        standby.lead(leader.lease.epoch or 0, holds=leader.holds)
        service.metrics.leader_epoch = leader.lease.epoch or 0
    return True, leader


async def serve(config: ServerConfig, *, announce: Callable[[str], None] | None = None) -> int:
    """Run the server until SIGTERM/SIGINT; returns the exit status."""
    say = announce or (lambda line: print(line, flush=True))
    # The cyclic collector runs on the event loop. What the imports made lives as long as the
    # process: frozen, it is out of its scans, so a full collection (~0.1 s per 100k objects
    # on this project's machine) scans only what the server made since. A young generation of
    # 10,000 objects (700 by default) lets the documents of in-flight requests die young
    # instead of being promoted, which made a full collection every second or so while
    # clients polled a large status (docs/results/2026-12-01-status-cost.md).
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG, 10, 10)
    postgres = is_postgres(config.db_path)
    # A database server's round trips stay off the event loop where the service can wait for
    # them: reports are committed in groups on a thread (only a store safe to share does so).
    service = PerseusService(
        open_store(config.db_path),
        config.limits,
        report_decoder=decode_report_bytes,
        ingest_off_loop=postgres,
    )
    standby = Standby()
    if not postgres:  # one server on its own file: it leads from the start
        service.load()
        standby.lead(None)
    try:
        front = _Front(config, service, standby if postgres else None)
        front.bind_grpc()
    except BaseException:  # the app or the port: nothing started yet, the store is closed
        _close_store(service, None)
        raise
    # Only once the servers are built: a warm-up begun before a failure there was cancelled
    # while its child process was being spawned, and the process then never exited.
    warming = warm_kernels(service.solver)  # a standby warms them too: it serves sooner

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    tokens = TokenFiles(config, front.credentials)
    loop.add_signal_handler(signal.SIGHUP, tokens.reload, "SIGHUP")
    token_watch = asyncio.create_task(tokens.watch()) if tokens.paths else None
    leader: Leader | None = None
    try:
        started = await front.start(say)
    except BaseException:  # a port it cannot have: what it opened is closed, then it fails
        if warming is not None:
            warming.cancel()
        _close_store(service, None)
        raise
    if not started:
        code = 1
    else:
        serving, leader = await _lead(config, service, front, standby, stop, say)
        if serving:
            await _serve_until_stopped(config, service, front, leader, stop, say)
        code = 0
    await _shut_down(config, service, front, warming, token_watch)
    _close_store(service, leader)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.remove_signal_handler(sig)
    deposed = leader is not None and leader.deposed is not None
    if code == 0:
        say("perseus: stopped (deposed)" if deposed else "perseus: stopped")
    sys.stdout.flush()
    return DEPOSED_EXIT if deposed else code


async def _serve_until_stopped(
    config: ServerConfig,
    service: PerseusService,
    front: _Front,
    leader: Leader | None,
    stop: asyncio.Event,
    say: Callable[[str], None],
) -> None:
    if leader is not None:
        leader.watch(stop)  # losing the lease stops the server
    tls = front.tls
    say(
        f"perseus: ready (db {describe(config.db_path)}, auth {'on' if config.token else 'off'}, tls {'on' if tls else 'off'})"
    )
    stop_task = asyncio.create_task(stop.wait())
    assert front.http_task is not None
    await asyncio.wait({front.http_task, stop_task}, return_when=asyncio.FIRST_COMPLETED)
    stop_task.cancel()


async def _shut_down(
    config: ServerConfig,
    service: PerseusService,
    front: _Front,
    warming: asyncio.Task[None] | None,
    token_watch: asyncio.Task[None] | None,
) -> None:
    log.info("shutting down")
    service.hub.close(None, StreamEnd.SHUTDOWN)
    await front.stop(config.shutdown_grace)
    if token_watch is not None:
        token_watch.cancel()
    if warming is not None and not warming.done():
        warming.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await warming
    with contextlib.suppress(NotLeader):  # deposed: what it would still write is refused
        await service.shutdown()
