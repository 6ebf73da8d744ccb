"""The node daemon's server: asyncio Unix-socket connections, peer checks and GPU leases.

**Connections are leases, held by a process.** A client leases a GPU (named by UUID, or by NVML
index for older clients) on its connection; while it holds the lease only that connection may
lock or reset the GPU's SM clock, and a second connection asking for the GPU gets
``LEASE_HELD`` naming the holder. The lease ends, and the GPU is reset, when the connection
closes for any reason (exit, SIGKILL, OOM kill, crash: the kernel closes the socket), when it is
silent for ``lease_timeout`` seconds (a stopped process: its heartbeat thread does not run
either), or when **the process that opened the connection** (the pid of ``SO_PEERCRED``, checked
with its start time, so a reused pid does not count) has exited: a forked child that inherited
the socket and keeps heartbeating does not keep the GPU locked after its parent died.

**Ownership.** A lease is granted only on a GPU the peer owns
(:mod:`~perseus_gpud.ownership`: with a kubelet, a process in a pod owns what the kubelet
assigned its pod; otherwise its device node open), checked before anything about the GPU's
holder is told; the holder is labelled with what the peer is (its pod, namespace, Slurm job)
and the Perseus job and tenant its client named at lease time (``GpuRef.job``/``tenant``).

**Who may ask.** Each connection's peer credentials are read from the socket (``SO_PEERCRED``:
pid, uid, gid; supplementary groups from ``/proc/<pid>/status``). Root is always allowed; other
peers need an allowed uid, or a primary or supplementary gid in the allowed gids. Status and
heartbeat are open to any peer that can open the socket (the socket file's mode and group are the
first gate); every other call from a peer not allowed is refused with ``PERMISSION_DENIED``.
Root and the admin groups see every GPU in status and may read any GPU's clocks, energy and
samples; any other peer only the GPUs it leases or owns (``NOT_OWNER`` otherwise).
Clocks must be in the GPU's supported set; requests are size-bounded by the frame codec.

**Power floors.** The holder of a lease may hold a power floor on its GPU
(``set_power_floor``: NVML power smoothing, the floor as a percentage of the power limit and
the ramp rates; ``docs/power.md``); the floor is released when the lease ends, for any reason,
and when the daemon stops. A GPU without power smoothing answers ``applied = false`` and why
(also in the lease's ``GpuInfo.floor_unavailable``).

**Resets.** :meth:`GpudServer.serve` resets, before it accepts a connection, only the GPUs its
lock record (``--state``) says it left locked (recovery from a crash of the daemon), never a
clock another tool set; when it stops it resets the GPUs it locked. With ``read_only`` nothing is
ever set or reset: the server answers as usual and logs what it would have done.

**Log.** One INFO line per lease, release (with the number of clock changes it made), reset and
refusal, ERROR for failures; each clock change is DEBUG.

**Connections** are bounded (:mod:`~perseus_gpud.limits`): in all and per uid, with a
reserve for peers allowed to lease; idle non-leasing connections and partial frames time out.

NVML calls run on each GPU's worker thread (:class:`~perseus_gpud.devices.ManagedGpu`),
never on the event loop, so a slow driver call does not delay heartbeats or other GPUs.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import os
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.message import DecodeError

from perseus_client.errors import GpuError, UnsupportedClockError
from perseus_common.gpud_wire import FrameTooLargeError, encode_frame
from perseus_common.proto import gpud_pb2
from perseus_gpud import procfs
from perseus_gpud.access import (
    Access,
    GpudStartError,
    Refused,
    error_response,
    lease_tag,
    listen_unix,
)
from perseus_gpud.devices import ManagedGpu
from perseus_gpud.limits import ConnectionLimits, ConnectionTimeout, read_request
from perseus_gpud.lockrecord import LockRecord
from perseus_gpud.ownership import Owner, Ownership
from perseus_gpud.peers import Peer, PeerPolicy, peer_of
from perseus_gpud.replies import (
    clock_state,
    gpu_info,
    holder_labels,
    resolve_gpu,
    status_message,
)

__all__ = ["Peer", "PeerPolicy", "GpudServer", "GpudStartError", "peer_of"]

log = logging.getLogger("perseus_gpud")


@dataclass(eq=False)
class _Conn:
    peer: Peer
    writer: asyncio.StreamWriter
    allowed: bool
    last_seen: float
    start: int | None = None  # the peer process's start time (None: not visible)
    leases: set[int] = field(default_factory=set)
    owners: dict[int, Owner] = field(default_factory=dict)
    changes: Counter[int] = field(default_factory=Counter)


class GpudServer:
    """Serves ``gpus`` on a Unix socket (see the module docstring).

    Args:
        gpus: the managed GPUs.
        policy: which peers are allowed.
        lease_timeout: seconds without a request after which a connection loses its leases.
        read_only: never set or reset a clock (log what would have been done).
        ownership: how a peer's ownership of a GPU is checked (default: not checked).
        record: the lock record (``--state``): what to reset at start.
        limits: connection limits and timeouts.
    """

    def __init__(
        self,
        gpus: Sequence[ManagedGpu],
        *,
        policy: PeerPolicy,
        lease_timeout: float = 5.0,
        read_only: bool = False,
        ownership: Ownership | None = None,
        record: LockRecord | None = None,
        limits: ConnectionLimits | None = None,
    ) -> None:
        if not lease_timeout > 0:
            raise ValueError(f"lease_timeout: must be > 0 seconds, got {lease_timeout}")
        self.gpus = {g.index: g for g in gpus}
        self.policy = policy
        self.lease_timeout = float(lease_timeout)
        self.read_only = read_only
        self.ownership = ownership if ownership is not None else Ownership()
        self.access = Access(policy, self.ownership)
        self.record = record
        self.limits = limits if limits is not None else ConnectionLimits()
        self._leases: dict[int, _Conn] = {}
        self._conns: set[_Conn] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._stop: asyncio.Event | None = None
        #: Refusals by ``(GPU UUID or "", error code name, peer uid)``, for the metrics.
        self.refusals: Counter[tuple[str, str, int]] = Counter()
        #: Connections refused or closed by the limits, by reason (``limit``, ``idle``, ``frame``).
        self.connections_closed: Counter[str] = Counter()
        self._limit_logged: dict[int, float] = {}
        self.started = time.time()

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
        """Reset what the record says was left locked, listen on ``path`` until :meth:`stop`.

        Then reset the GPUs this daemon locked.
        """
        self._stop = asyncio.Event()
        await self._recover()
        server = await listen_unix(path, self._serve_connection, gid, mode)
        ino = os.stat(path).st_ino
        watchdog = asyncio.create_task(self._watchdog())
        log.info(
            "perseus gpud: serving GPUs %s on %s (allowed: %s; ownership: %s; lease timeout "
            "%.1f s; at most %d connections, %d per uid%s)",
            ", ".join(f"{g.index} ({g.uuid})" for g in self.gpus.values()),
            path,
            self.policy.describe(),
            self.ownership.describe(),
            self.lease_timeout,
            self.limits.max_connections,
            self.limits.max_per_uid,
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
            recorded = self.record.locked() if self.record is not None else {}
            for gpu in self.gpus.values():
                if gpu.locked_mhz is not None or gpu.uuid in recorded:
                    await self._reset(gpu, "at stop")
            with contextlib.suppress(OSError):
                if os.stat(path).st_ino == ino:
                    os.unlink(path)

    async def _recover(self) -> None:
        recorded = self.record.locked() if self.record is not None else {}
        by_uuid = {g.uuid: g for g in self.gpus.values()}
        for uuid, mhz in sorted(recorded.items()):
            gpu = by_uuid.get(uuid)
            if gpu is None:
                log.warning(
                    "the lock record says GPU %s was left at %d MHz, but this daemon does not "
                    "manage it (--gpus?); left alone",
                    uuid,
                    mhz,
                )
                continue
            await self._reset(gpu, f"at start (this daemon left it locked at {mhz} MHz)")
        if not recorded:
            log.info("no clock left locked by an earlier run: nothing to reset at start")
        floors = self.record.floors() if self.record is not None and not self.read_only else {}
        for uuid, watts in sorted(floors.items()):
            gpu = by_uuid.get(uuid)
            if gpu is None:
                log.warning("the lock record says GPU %s was left with a %.0f W power floor, "
                            "but this daemon does not manage it (--gpus?); left alone", uuid, watts)  # fmt: skip
                continue
            try:
                await self._run(gpu, gpu.release_recorded_floor)
                log.info("released GPU %d's power floor of %.0f W (left by an earlier run)",
                         gpu.index, watts)  # fmt: skip
            except Exception as exc:  # noqa: BLE001 - log and go on with the other GPUs
                log.error("could not release GPU %d's power floor at start: %s", gpu.index, exc)

    async def _reset(self, gpu: ManagedGpu, when: str) -> bool:
        if self.read_only:
            log.info("read-only: would reset GPU %d %s", gpu.index, when)
            return False
        try:
            applied = bool(await self._run(gpu, gpu.reset))
        except Exception as exc:  # noqa: BLE001 - log and go on with the other GPUs
            log.error("could not reset GPU %d (%s) %s: %s", gpu.index, gpu.uuid, when, exc)
            return False
        log.info("reset GPU %d (%s) %s", gpu.index, gpu.uuid, when)
        return applied

    async def _run(self, gpu: ManagedGpu, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(gpu.worker, fn, *args)

    # -- connections ------------------------------------------------------------------------------

    def _admission(self, peer: Peer, allowed: bool) -> str | None:
        from_uid = sum(1 for c in self._conns if c.peer.uid == peer.uid)
        return self.limits.refusal(len(self._conns), from_uid, peer.uid, allowed)

    def _log_limited(self, peer: Peer, why: str) -> None:
        now = time.monotonic()
        if now - self._limit_logged.get(peer.uid, -1e9) >= 10.0:  # one line per uid per 10 s
            self._limit_logged[peer.uid] = now
            n = self.connections_closed["limit"]
            log.info("refused a connection from %s: %s (%d refused so far)", peer, why, n)

    async def _serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            try:
                peer = peer_of(writer.get_extra_info("socket"))
            except OSError as exc:  # pragma: no cover - the peer vanished at once
                log.info("could not read a peer's credentials: %s", exc)
                writer.close()
                return
            allowed = self.policy.allows(peer)
            why = self._admission(peer, allowed)
            if why is not None:
                self.connections_closed["limit"] += 1
                self._log_limited(peer, why)
                conn = _Conn(peer, writer, allowed, time.monotonic())
                with contextlib.suppress(OSError, TimeoutError):
                    await self._send(conn, error_response(0, gpud_pb2.BUSY, why))
                writer.transport.abort()
                return
            conn = _Conn(peer, writer, allowed, time.monotonic(), start=procfs.start_time(peer.pid))
            self._conns.add(conn)
            log.debug("connection from %s", peer)
            try:
                await self._serve_requests(conn, reader)
            finally:
                self._conns.discard(conn)
                await self._release_all(conn, "its connection closed")
                writer.transport.abort()
        finally:
            if task is not None:
                self._tasks.discard(task)

    async def _serve_requests(self, conn: _Conn, reader: asyncio.StreamReader) -> None:
        peer = conn.peer
        try:
            while True:
                try:
                    idle = None if conn.leases else self.limits.idle_timeout
                    body = await read_request(reader, idle, self.limits.frame_timeout)
                except FrameTooLargeError as exc:
                    self.refusals[("", "TOO_LARGE", peer.uid)] += 1
                    log.info("refused a request from %s: %s", peer, exc)
                    await self._send(conn, error_response(0, gpud_pb2.TOO_LARGE, str(exc)))
                    return
                except ConnectionTimeout as exc:
                    kind = "idle" if "idle" in str(exc) else "frame"
                    self.connections_closed[kind] += 1
                    log.info("closed the connection of %s: %s", peer, exc)
                    await self._send(conn, error_response(0, gpud_pb2.TIMEOUT, str(exc)))
                    return
                conn.last_seen = time.monotonic()
                try:
                    request = gpud_pb2.Request.FromString(body)
                except DecodeError as exc:
                    message = f"malformed request: {exc}"
                    self.refusals[("", "INVALID_ARGUMENT", peer.uid)] += 1
                    log.info("refused a request from %s: %s", peer, message)
                    await self._send(conn, error_response(0, gpud_pb2.INVALID_ARGUMENT, message))
                    continue
                await self._send(conn, await self._dispatch(conn, request))
        except (asyncio.IncompleteReadError, ConnectionError, TimeoutError):
            pass  # the peer closed the connection (or was killed, or does not read)

    async def _send(self, conn: _Conn, response: gpud_pb2.Response) -> None:
        conn.writer.write(encode_frame(response.SerializeToString()))
        await asyncio.wait_for(conn.writer.drain(), self.limits.frame_timeout)

    async def _release_all(self, conn: _Conn, why: str) -> None:
        for index in sorted(conn.leases):
            await self._release(conn, index, why)

    async def _release(self, conn: _Conn, index: int, why: str) -> gpud_pb2.ClockState:
        conn.leases.discard(index)
        conn.owners.pop(index, None)
        changes = conn.changes.pop(index, 0)
        if self._leases.get(index) is conn:
            del self._leases[index]
        gpu = self.gpus[index]
        applied = False
        if gpu.floor_w > 0:
            try:
                await self._run(gpu, gpu.release_floor)
                log.info("GPU %d: released the power floor of %s (%s)", index, conn.peer, why)
            except Exception as exc:  # noqa: BLE001 - log; the clocks are reset all the same
                log.error("GPU %d: could not release the power floor: %s", index, exc)
        recorded = self.record is not None and gpu.uuid in self.record.locked()
        if gpu.locked_mhz is None and not recorded and not self.read_only:
            log.info(
                "GPU %d: lease of %s ended (%s) after %d clock changes; no clock locked",
                index,
                conn.peer,
                why,
                changes,
            )
        else:
            log.info(
                "GPU %d: lease of %s ended (%s) after %d clock changes; resetting its clocks",
                index,
                conn.peer,
                why,
                changes,
            )
            try:
                applied = await self._run(gpu, gpu.reset)
            except Exception as exc:  # noqa: BLE001 - log; the next holder's lock replaces it
                log.error("GPU %d: could not reset after %s's lease: %s", index, conn.peer, exc)
        return gpud_pb2.ClockState(index=index, uuid=gpu.uuid, applied=applied)

    def _holder_gone(self, conn: _Conn) -> bool:
        """True when the process that opened ``conn`` has exited (a child may hold the socket)."""
        return conn.start is not None and procfs.start_time(conn.peer.pid) != conn.start

    async def _drop(self, conn: _Conn, why: str) -> None:
        self._conns.discard(conn)
        await self._release_all(conn, why)
        conn.writer.transport.abort()

    async def _reap(self) -> None:
        """Drop every lease whose holder process exited."""
        for conn in list(self._leases.values()):
            if conn in self._conns and self._holder_gone(conn):
                await self._drop(conn, f"its process, pid {conn.peer.pid}, exited")

    async def _watchdog(self) -> None:
        period = min(0.25, self.lease_timeout / 4)
        while True:
            await asyncio.sleep(period)
            await self._reap()
            now = time.monotonic()
            for conn in list(self._conns):
                if conn.leases and now - conn.last_seen > self.lease_timeout:
                    await self._drop(
                        conn,
                        f"sent nothing for {now - conn.last_seen:.1f} s, lease timeout "
                        f"{self.lease_timeout:.1f} s",
                    )

    # -- requests ---------------------------------------------------------------------------------

    async def _dispatch(self, conn: _Conn, request: gpud_pb2.Request) -> gpud_pb2.Response:
        call = request.WhichOneof("call")
        try:
            if call == "heartbeat":
                return gpud_pb2.Response(id=request.id, heartbeat=gpud_pb2.Empty())
            if call == "status":
                await self._reap()
                visible = await self.access.visible(conn.peer, conn.allowed, conn.leases, self.gpus)
                return gpud_pb2.Response(
                    id=request.id,
                    status=status_message(
                        self.gpus, self.holder, self.read_only, self.lease_timeout, visible
                    ),
                )
            if call is None:
                raise Refused(gpud_pb2.INVALID_ARGUMENT, "empty request (no call set)")
            if not conn.allowed:
                raise Refused(
                    gpud_pb2.PERMISSION_DENIED,
                    f"uid {conn.peer.uid} (pid {conn.peer.pid}, gid {conn.peer.gid}) may not use "
                    f"this daemon: it allows {self.policy.describe()} (see --allow-uid/--allow-gid)",
                )
            try:
                gpu = resolve_gpu(self.gpus, getattr(request, call))
            except LookupError as exc:
                raise Refused(gpud_pb2.NOT_FOUND, str(exc.args[0])) from exc
            try:
                return await self._gpu_call(conn, request.id, call, gpu, request)
            except Refused as exc:
                exc.uuid = gpu.uuid
                raise
        except Refused as exc:
            self.refusals[(exc.uuid, gpud_pb2.ErrorCode.Name(exc.code), conn.peer.uid)] += 1
            log.info("refused %s from %s: %s", call, conn.peer, exc)
            return error_response(request.id, exc.code, str(exc))

    def _holder_check(self, conn: _Conn, gpu: ManagedGpu) -> None:
        """Refuse a change by a connection that does not hold the lease (``NOT_LEASED``).

        Who holds it is told only to a peer that owns the GPU, when it asks for the lease.
        """
        if self._leases.get(gpu.index) is not conn:
            raise Refused(
                gpud_pb2.NOT_LEASED,
                f"GPU {gpu.index} is not leased by this connection; lease it first",
            )

    def _held(self, gpu: ManagedGpu, holder: _Conn) -> Refused:
        return Refused(
            gpud_pb2.LEASE_HELD,
            f"GPU {gpu.index} ({gpu.uuid}) is leased by pid {holder.peer.pid} "
            f"(uid {holder.peer.uid}{holder_labels(holder.owners.get(gpu.index))}); "
            "one process at a time may control a GPU's clocks",
        )

    async def _lease(self, conn: _Conn, gpu: ManagedGpu, ref: gpud_pb2.GpuRef) -> None:
        if self._leases.get(gpu.index) is conn:
            return
        tags = {
            "job": lease_tag(ref.job, "lease.job"),
            "tenant": lease_tag(ref.tenant, "lease.tenant"),
        }
        # Ownership first: who holds a GPU is told only to a peer that owns it.
        owner = await self.access.lease_owner(conn.peer, gpu)
        holder = self._leases.get(gpu.index)  # the check ran off the loop: look now
        if holder is conn:
            return
        if holder is not None and self._holder_gone(holder):
            await self._drop(holder, f"its process, pid {holder.peer.pid}, exited")
            holder = self._leases.get(gpu.index)
        if holder is not None and holder is not conn:
            raise self._held(gpu, holder)
        owner = dataclasses.replace(owner, **tags)
        self._leases[gpu.index] = conn
        conn.leases.add(gpu.index)
        conn.owners[gpu.index] = owner
        log.info(
            "GPU %d (%s): leased by %s (%s%s)",
            gpu.index,
            gpu.uuid,
            conn.peer,
            owner.how,
            holder_labels(owner),
        )

    async def _gpu_call(
        self, conn: _Conn, req_id: int, call: str, gpu: ManagedGpu, request: gpud_pb2.Request
    ) -> gpud_pb2.Response:
        peer = conn.peer
        try:
            if call == "lease":
                await self._lease(conn, gpu, request.lease)
                return gpud_pb2.Response(
                    id=req_id,
                    lease=gpud_pb2.Lease(
                        gpu=gpu_info(gpu),
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
                conn.changes[gpu.index] += 1
                verb = "locked" if applied else "read-only: would lock"
                log.debug("GPU %d: %s the SM clock at %d MHz for %s", gpu.index, verb, mhz, peer)
                return gpud_pb2.Response(id=req_id, clock=clock_state(gpu, applied))
            if call == "reset_clock":
                self._holder_check(conn, gpu)
                applied = await self._run(gpu, gpu.reset, False)
                conn.changes[gpu.index] += 1
                verb = "reset" if applied else "read-only: would reset"
                log.debug("GPU %d: %s the SM clock for %s", gpu.index, verb, peer)
                return gpud_pb2.Response(id=req_id, clock=clock_state(gpu, applied))
            if call == "set_power_floor":
                return await self._set_floor(conn, req_id, gpu, request.set_power_floor)
            if call in ("supported_clocks", "energy", "sample"):
                await self.access.may_read(conn.peer, conn.leases, gpu)
            if call == "supported_clocks":
                return gpud_pb2.Response(id=req_id, supported_clocks=gpu_info(gpu))
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
            raise Refused(gpud_pb2.UNSUPPORTED_CLOCK, str(exc)) from exc
        except GpuError as exc:
            log.error("GPU %d: NVML failed for %s's %s: %s", gpu.index, peer, call, exc)
            raise Refused(gpud_pb2.DEVICE_ERROR, str(exc)) from exc
        raise Refused(gpud_pb2.INVALID_ARGUMENT, f"unknown call {call!r}")  # pragma: no cover

    async def _set_floor(
        self, conn: _Conn, req_id: int, gpu: ManagedGpu, req: gpud_pb2.SetPowerFloor
    ) -> gpud_pb2.Response:
        """Hold a power floor on a GPU this connection leases (released when the lease ends)."""
        self._holder_check(conn, gpu)
        watts, ramp = float(req.watts), float(req.ramp_w_per_s)
        limit = gpu.max_power_limit_w or math.inf
        if not 0 <= watts <= limit:
            raise Refused(
                gpud_pb2.INVALID_ARGUMENT,
                f"set_power_floor.watts: {watts!r} W is outside 0..{limit:g} W (GPU "
                f"{gpu.index}'s power limit)",
            )
        if not 0 <= ramp < math.inf:
            raise Refused(
                gpud_pb2.INVALID_ARGUMENT,
                f"set_power_floor.ramp_w_per_s: must be a finite number >= 0, got {ramp!r}",
            )
        applied = await self._run(gpu, gpu.set_power_floor, watts, ramp)
        conn.changes[gpu.index] += 1
        why = gpu.floor_unavailable or ("read-only" if self.read_only else "")
        log.debug(
            "GPU %d: power floor %.0f W (ramp %.0f W/s) for %s: %s",
            gpu.index, watts, ramp, conn.peer, "held" if applied else f"not applied ({why})",
        )  # fmt: skip
        state = gpud_pb2.PowerFloorState(
            index=gpu.index,
            uuid=gpu.uuid,
            watts=gpu.floor_w,
            applied=applied,
            unavailable=gpu_info(gpu).floor_unavailable,
        )
        return gpud_pb2.Response(id=req_id, power_floor=state)

    # -- replies ----------------------------------------------------------------------------------

    def holder(self, index: int) -> tuple[Peer, Owner] | None:
        """The live holder of GPU ``index`` and why it owns it (``None``: not leased)."""
        conn = self._leases.get(index)
        if conn is None or self._holder_gone(conn):
            return None
        return conn.peer, conn.owners.get(index, Owner("unchecked"))

    def connection_count(self) -> int:
        """The number of connections open now."""
        return len(self._conns)
