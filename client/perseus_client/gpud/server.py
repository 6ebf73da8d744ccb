"""The node daemon's server: asyncio Unix-socket connections, peer checks and GPU leases.

**Connections are leases.** A client leases a GPU on its connection; while it holds the lease
only that connection may lock or reset the GPU's SM clock, and a second connection asking for the
GPU gets ``LEASE_HELD`` naming the holder's pid and uid. When the connection closes for any
reason (exit, SIGKILL, OOM kill, crash: the kernel closes the socket) the server sees end of
stream at once, drops the lease and resets the GPU's locked clocks. Every request renews the
connection's leases; a connection silent for ``lease_timeout`` seconds (a stopped process: its
heartbeat thread does not run either) loses them: the GPUs are reset and the connection closed.

**Who may ask.** Each connection's peer credentials are read from the socket (``SO_PEERCRED``:
pid, uid, gid; supplementary groups from ``/proc/<pid>/status``). Root is always allowed; other
peers need an allowed uid, or a primary or supplementary gid in the allowed gids. Status and
heartbeat are open to any peer that can open the socket (the socket file's mode and group are the
first gate); every other call from a peer not allowed is refused with ``PERMISSION_DENIED``.
Clocks must be in the GPU's supported set; requests are size-bounded by the frame codec.

**Resets.** :meth:`GpudServer.serve` resets every managed GPU before it accepts a connection
(recovery from an earlier crash of the daemon or of a trainer) and again when it stops. With
``read_only`` nothing is ever set or reset: the server answers as usual and logs what it would
have done. Every change and every refusal is logged with the peer's pid and uid.

NVML calls run on each GPU's worker thread (:class:`~perseus_client.gpud.devices.ManagedGpu`),
never on the event loop, so a slow driver call does not delay heartbeats or other GPUs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import stat
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.message import DecodeError

from perseus_client.errors import GpuError, UnsupportedClockError
from perseus_client.gpud.devices import ManagedGpu
from perseus_client.gpud.protocol import (
    HEADER_SIZE,
    FrameTooLargeError,
    encode_frame,
    frame_size,
)
from perseus_common.proto import gpud_pb2

__all__ = ["Peer", "PeerPolicy", "GpudServer", "GpudStartError", "peer_of", "read_frame_async"]

log = logging.getLogger("perseus_client.gpud")


class GpudStartError(RuntimeError):
    """The daemon cannot start (socket path in use, not a socket, ...)."""


@dataclass(frozen=True)
class Peer:
    """The process at the other end of a connection, as the kernel reports it."""

    pid: int
    uid: int
    gid: int
    groups: frozenset[int] = frozenset()

    def __str__(self) -> str:
        return f"pid {self.pid} uid {self.uid}"


@dataclass(frozen=True)
class PeerPolicy:
    """Which peers may lease GPUs and use them: root, ``uids``, and members of ``gids``."""

    uids: frozenset[int] = frozenset()
    gids: frozenset[int] = frozenset()

    def allows(self, peer: Peer) -> bool:
        """Whether ``peer`` may make calls other than status and heartbeat."""
        if peer.uid == 0 or peer.uid in self.uids:
            return True
        return peer.gid in self.gids or not self.gids.isdisjoint(peer.groups)

    def describe(self) -> str:
        """The policy in words, for logs and refusals."""
        parts = ["root"]
        if self.uids:
            parts.append("uids " + ", ".join(map(str, sorted(self.uids))))
        if self.gids:
            parts.append("gids " + ", ".join(map(str, sorted(self.gids))))
        return " and ".join(parts)


def _supplementary_groups(pid: int) -> frozenset[int]:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Groups:"):
                    return frozenset(int(g) for g in line.split()[1:])
    except (OSError, ValueError):
        pass
    return frozenset()


def peer_of(sock: Any) -> Peer:
    """The credentials of the peer of a connected Unix socket (``SO_PEERCRED``)."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return Peer(pid, uid, gid, _supplementary_groups(pid))


@dataclass(eq=False)
class _Conn:
    peer: Peer
    writer: asyncio.StreamWriter
    allowed: bool
    last_seen: float
    leases: set[int] = field(default_factory=set)


async def read_frame_async(reader: asyncio.StreamReader) -> bytes:
    """Read one frame's body (``asyncio.IncompleteReadError`` at end of stream)."""
    size = frame_size(await reader.readexactly(HEADER_SIZE))
    return await reader.readexactly(size) if size else b""


def _error(req_id: int, code: gpud_pb2.ErrorCode, message: str) -> gpud_pb2.Response:
    return gpud_pb2.Response(id=req_id, error=gpud_pb2.Error(code=code, message=message))


class _Refused(Exception):
    def __init__(self, code: gpud_pb2.ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class GpudServer:
    """Serves ``gpus`` on a Unix socket (see the module docstring).

    Args:
        gpus: the managed GPUs.
        policy: which peers are allowed.
        lease_timeout: seconds without a request after which a connection loses its leases.
        read_only: never set or reset a clock (log what would have been done).
    """

    def __init__(
        self,
        gpus: Sequence[ManagedGpu],
        *,
        policy: PeerPolicy,
        lease_timeout: float = 5.0,
        read_only: bool = False,
    ) -> None:
        if not lease_timeout > 0:
            raise ValueError(f"lease_timeout: must be > 0 seconds, got {lease_timeout}")
        self.gpus = {g.index: g for g in gpus}
        self.policy = policy
        self.lease_timeout = float(lease_timeout)
        self.read_only = read_only
        self._leases: dict[int, _Conn] = {}
        self._conns: set[_Conn] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._stop: asyncio.Event | None = None

    # -- life cycle -------------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask :meth:`serve` to stop (safe from a signal handler on the loop)."""
        if self._stop is not None:
            self._stop.set()

    async def serve(
        self,
        path: str,
        *,
        gid: int | None = None,
        mode: int = 0o660,
        ready: Callable[[], None] | None = None,
    ) -> None:
        """Reset the GPUs, listen on ``path`` until :meth:`stop`, then reset them again."""
        self._stop = asyncio.Event()
        await self._reset_all("at start (recovery from an earlier run)")
        server = await self._listen(path, gid, mode)
        ino = os.stat(path).st_ino
        watchdog = asyncio.create_task(self._watchdog())
        log.info(
            "perseus gpud: serving GPUs %s on %s (allowed: %s; lease timeout %.1f s%s)",
            ", ".join(map(str, self.gpus)),
            path,
            self.policy.describe(),
            self.lease_timeout,
            "; read-only" if self.read_only else "",
        )
        if ready is not None:
            ready()
        try:
            await self._stop.wait()
        finally:
            log.info("perseus gpud: stopping")
            server.close()
            watchdog.cancel()
            for conn in list(self._conns):
                conn.writer.transport.abort()
            if self._tasks:
                await asyncio.wait(list(self._tasks), timeout=5.0)
            await self._reset_all("at stop")
            with contextlib.suppress(OSError):
                if os.stat(path).st_ino == ino:
                    os.unlink(path)

    async def _listen(self, path: str, gid: int | None, mode: int) -> asyncio.AbstractServer:
        parent = os.path.dirname(os.path.abspath(path))
        os.makedirs(parent, mode=0o755, exist_ok=True)
        if os.path.lexists(path):
            if not stat.S_ISSOCK(os.lstat(path).st_mode):
                raise GpudStartError(
                    f"{path} exists and is not a socket; remove it or pick another"
                )
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(path)
            except OSError:
                os.unlink(path)  # a stale socket of a daemon that died
            else:
                raise GpudStartError(f"another daemon is already serving on {path}")
            finally:
                probe.close()
        old = os.umask(0o177)  # no window in which others may connect
        try:
            server = await asyncio.start_unix_server(self._serve_connection, path=path)
        finally:
            os.umask(old)
        if gid is not None:
            os.chown(path, -1, gid)
        os.chmod(path, mode)
        return server

    async def _reset_all(self, when: str) -> None:
        for gpu in self.gpus.values():
            if self.read_only:
                log.info("read-only: would reset GPU %d %s", gpu.index, when)
                continue
            try:
                await self._run(gpu, gpu.reset)
                log.info("reset GPU %d %s", gpu.index, when)
            except Exception as exc:  # noqa: BLE001 - log and go on with the other GPUs
                log.error("could not reset GPU %d %s: %s", gpu.index, when, exc)

    async def _run(self, gpu: ManagedGpu, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(gpu.worker, fn, *args)

    # -- connections ------------------------------------------------------------------------------

    async def _serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            peer = peer_of(writer.get_extra_info("socket"))
        except OSError as exc:  # pragma: no cover - the peer vanished at once
            log.warning("could not read a peer's credentials: %s", exc)
            writer.close()
            if task is not None:
                self._tasks.discard(task)
            return
        conn = _Conn(peer, writer, self.policy.allows(peer), time.monotonic())
        self._conns.add(conn)
        log.debug("connection from %s", peer)
        try:
            while True:
                try:
                    body = await read_frame_async(reader)
                except FrameTooLargeError as exc:
                    log.warning("refused a request from %s: %s", peer, exc)
                    await self._send(conn, _error(0, gpud_pb2.TOO_LARGE, str(exc)))
                    return
                conn.last_seen = time.monotonic()
                try:
                    request = gpud_pb2.Request.FromString(body)
                except DecodeError as exc:
                    message = f"malformed request: {exc}"
                    log.warning("refused a request from %s: %s", peer, message)
                    await self._send(conn, _error(0, gpud_pb2.INVALID_ARGUMENT, message))
                    continue
                await self._send(conn, await self._dispatch(conn, request))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the peer closed the connection (or was killed)
        finally:
            self._conns.discard(conn)
            await self._release_all(conn, "its connection closed")
            writer.close()
            if task is not None:
                self._tasks.discard(task)

    async def _send(self, conn: _Conn, response: gpud_pb2.Response) -> None:
        conn.writer.write(encode_frame(response.SerializeToString()))
        await conn.writer.drain()

    async def _release_all(self, conn: _Conn, why: str) -> None:
        for index in sorted(conn.leases):
            await self._release(conn, index, why)

    async def _release(self, conn: _Conn, index: int, why: str) -> gpud_pb2.ClockState:
        conn.leases.discard(index)
        if self._leases.get(index) is conn:
            del self._leases[index]
        gpu = self.gpus[index]
        log.info("GPU %d: lease of %s ended (%s); resetting its clocks", index, conn.peer, why)
        applied = False
        try:
            applied = await self._run(gpu, gpu.reset)
        except Exception as exc:  # noqa: BLE001 - log; the next holder's lock replaces it
            log.error("GPU %d: could not reset after %s's lease: %s", index, conn.peer, exc)
        return gpud_pb2.ClockState(index=index, applied=applied)

    async def _watchdog(self) -> None:
        period = min(0.25, self.lease_timeout / 4)
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            for conn in list(self._conns):
                if conn.leases and now - conn.last_seen > self.lease_timeout:
                    self._conns.discard(conn)
                    log.warning(
                        "%s sent nothing for %.1f s (lease timeout %.1f s): dropping its leases",
                        conn.peer,
                        now - conn.last_seen,
                        self.lease_timeout,
                    )
                    await self._release_all(conn, "lease timeout")
                    conn.writer.transport.abort()

    # -- requests ---------------------------------------------------------------------------------

    async def _dispatch(self, conn: _Conn, request: gpud_pb2.Request) -> gpud_pb2.Response:
        call = request.WhichOneof("call")
        try:
            if call == "heartbeat":
                return gpud_pb2.Response(id=request.id, heartbeat=gpud_pb2.Empty())
            if call == "status":
                return gpud_pb2.Response(id=request.id, status=self._status())
            if call is None:
                raise _Refused(gpud_pb2.INVALID_ARGUMENT, "empty request (no call set)")
            if not conn.allowed:
                raise _Refused(
                    gpud_pb2.PERMISSION_DENIED,
                    f"uid {conn.peer.uid} (pid {conn.peer.pid}, gid {conn.peer.gid}) may not use "
                    f"this daemon: it allows {self.policy.describe()} (see --allow-uid/--allow-gid)",
                )
            index = int(getattr(request, call).index)
            gpu = self.gpus.get(index)
            if gpu is None:
                raise _Refused(
                    gpud_pb2.NOT_FOUND,
                    f"GPU {index} is not managed by this daemon (it manages "
                    f"{', '.join(map(str, self.gpus)) or 'none'})",
                )
            return await self._gpu_call(conn, request.id, call, gpu, request)
        except _Refused as exc:
            log.warning("refused %s from %s: %s", call, conn.peer, exc)
            return _error(request.id, exc.code, str(exc))

    def _holder_check(self, conn: _Conn, gpu: ManagedGpu) -> None:
        holder = self._leases.get(gpu.index)
        if holder is conn:
            return
        if holder is None:
            raise _Refused(
                gpud_pb2.NOT_LEASED,
                f"GPU {gpu.index} is not leased by this connection; lease it first",
            )
        raise self._held(gpu, holder)

    def _held(self, gpu: ManagedGpu, holder: _Conn) -> _Refused:
        return _Refused(
            gpud_pb2.LEASE_HELD,
            f"GPU {gpu.index} is leased by pid {holder.peer.pid} (uid {holder.peer.uid}); "
            "one process at a time may control a GPU's clocks",
        )

    async def _gpu_call(
        self, conn: _Conn, req_id: int, call: str, gpu: ManagedGpu, request: gpud_pb2.Request
    ) -> gpud_pb2.Response:
        peer = conn.peer
        try:
            if call == "lease":
                holder = self._leases.get(gpu.index)
                if holder is not None and holder is not conn:
                    raise self._held(gpu, holder)
                self._leases[gpu.index] = conn
                conn.leases.add(gpu.index)
                log.info("GPU %d: leased by %s", gpu.index, peer)
                return gpud_pb2.Response(
                    id=req_id,
                    lease=gpud_pb2.Lease(
                        gpu=self._info(gpu),
                        lease_timeout_s=self.lease_timeout,
                        read_only=self.read_only,
                    ),
                )
            if call == "release":
                self._holder_check(conn, gpu)
                return gpud_pb2.Response(
                    id=req_id, clock=await self._release(conn, gpu.index, "released")
                )
            if call == "set_clock":
                self._holder_check(conn, gpu)
                mhz = int(request.set_clock.mhz)
                applied = await self._run(gpu, gpu.lock, mhz)
                verb = "locked" if applied else "read-only: would lock"
                log.info("GPU %d: %s the SM clock at %d MHz for %s", gpu.index, verb, mhz, peer)
                return gpud_pb2.Response(id=req_id, clock=self._clock(gpu, applied))
            if call == "reset_clock":
                self._holder_check(conn, gpu)
                applied = await self._run(gpu, gpu.reset)
                verb = "reset" if applied else "read-only: would reset"
                log.info("GPU %d: %s the SM clock for %s", gpu.index, verb, peer)
                return gpud_pb2.Response(id=req_id, clock=self._clock(gpu, applied))
            if call == "supported_clocks":
                return gpud_pb2.Response(id=req_id, supported_clocks=self._info(gpu))
            if call == "energy":
                energy = await self._run(gpu, gpu.energy_mj)
                return gpud_pb2.Response(
                    id=req_id, energy=gpud_pb2.Energy(index=gpu.index, energy_mj=energy)
                )
            if call == "sample":
                mhz, reasons, names = await self._run(gpu, gpu.sample)
                sample = gpud_pb2.Sample(
                    index=gpu.index, sm_mhz=mhz, reasons=reasons, reason_names=names
                )
                if gpu.locked_mhz is not None:
                    sample.locked_mhz = gpu.locked_mhz
                return gpud_pb2.Response(id=req_id, sample=sample)
        except UnsupportedClockError as exc:
            raise _Refused(gpud_pb2.UNSUPPORTED_CLOCK, str(exc)) from exc
        except GpuError as exc:
            raise _Refused(gpud_pb2.DEVICE_ERROR, str(exc)) from exc
        raise _Refused(gpud_pb2.INVALID_ARGUMENT, f"unknown call {call!r}")  # pragma: no cover

    # -- replies ----------------------------------------------------------------------------------

    @staticmethod
    def _info(gpu: ManagedGpu) -> gpud_pb2.GpuInfo:
        return gpud_pb2.GpuInfo(
            index=gpu.index,
            name=gpu.name,
            supported_clocks_mhz=gpu.clocks,
            max_power_limit_w=gpu.max_power_limit_w,
        )

    @staticmethod
    def _clock(gpu: ManagedGpu, applied: bool) -> gpud_pb2.ClockState:
        state = gpud_pb2.ClockState(index=gpu.index, applied=applied)
        if gpu.locked_mhz is not None:
            state.locked_mhz = gpu.locked_mhz
        return state

    def _status(self) -> gpud_pb2.Status:
        status = gpud_pb2.Status(read_only=self.read_only, lease_timeout_s=self.lease_timeout)
        for index, gpu in self.gpus.items():
            entry = status.gpus.add(index=index, name=gpu.name)
            if gpu.locked_mhz is not None:
                entry.locked_mhz = gpu.locked_mhz
            holder = self._leases.get(index)
            if holder is not None:
                entry.holder.pid = holder.peer.pid
                entry.holder.uid = holder.peer.uid
        return status
