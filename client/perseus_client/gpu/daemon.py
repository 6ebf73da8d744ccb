"""A GPU controlled through the node daemon ``perseus gpud`` (no privileges needed).

``DaemonGpu()`` connects to the daemon's Unix socket (``socket=``, else
``$PERSEUS_GPUD_SOCKET``, else ``/run/perseus/gpud.sock``), leases this process's GPU on that
connection and asks the daemon to lock and reset its SM clock and to read its energy counter. The
daemon resets the GPU as soon as the connection closes, so the GPU is reset whatever kills the
trainer.

**Which GPU.** By default the one the runtime gave this process
(:func:`~perseus_client.gpu.discovery.discover_gpu`: ``CUDA_VISIBLE_DEVICES`` /
``NVIDIA_VISIBLE_DEVICES`` as indices or UUIDs, and ``LOCAL_RANK``), so no node-level index has
to be configured; ``uuid=`` or ``index=`` name one explicitly. After the lease every request
names the GPU by the UUID the daemon answered. The daemon leases only a GPU this process owns
(its device node open, which CUDA does when it initialises the device, or assigned to its pod):
otherwise the lease is refused with ``NOT_OWNER``.

**Threads.** Clock changes come from the client's frequency controller thread (off the training
thread, as with :class:`~perseus_client.gpu.nvml.NvmlGpu`). A thread of this backend's own
sends a sample request every ``sample_interval`` seconds (at least four per lease timeout): that
is the heartbeat that keeps the lease, and it samples the applied clock. It never waits on the
clock thread, which may itself be waiting on a CUDA event through a long collective, so a busy
trainer keeps its lease and a stopped one (SIGSTOP) loses it.

**Fail-open.** If the daemon goes away mid-run, training goes on: the backend logs one warning,
clock requests are remembered but not applied, energy reads return the last value, and the
background thread reconnects with exponential backoff; when the daemon is back it re-leases the
GPU, applies the clock last requested and logs once more. Refusals (a clock not supported, a
lease held by another process, a uid the daemon does not allow) raise
:class:`~perseus_client.errors.GpudRefusedError` subclasses, which are
:class:`~perseus_client.errors.GpuError` s. Construction waits up to ``connect_timeout`` seconds
for the daemon and raises :class:`~perseus_client.errors.GpudUnavailableError` after.

**Applied clocks.** While an instruction runs (between the client's ``begin_instruction`` and
``end_instruction`` hooks, which only store a tuple on the training thread) and a lock is in
effect, each sample compares the SM clock the GPU runs at with the clock the daemon locked.
:meth:`DaemonGpu.take_applied_clocks` returns what was seen since the last call as an
:class:`AppliedClockReport`: how many samples, the instructions that ran off-plan (sampled clock
more than one supported step below the locked one: :mod:`perseus_client.gpu.applied`) with the
NVML clock-event reasons seen
(``sw_power_cap``, ``hw_thermal_slowdown``, ...), and every reason seen. On real GPUs the CPU
side of an instruction runs ahead of the GPU, so the attribution to an instruction is
approximate; the comparison with the lock is exact.

**Power floors.** :meth:`DaemonGpu.set_power_floor` asks the daemon to hold a floor on the
leased GPU (``set_power_floor``: NVML power smoothing, with the ramp rates); the daemon says at
lease time whether its GPU can (``GpuInfo.floor_unavailable``) and releases the floor when the
lease ends, so a killed trainer leaves no floor behind. While the daemon is away no floor is
held; the client's floor thread sets the next one after the lease is back.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from perseus_client.errors import (
    GpudError,
    GpudRefusedError,
    GpudUnavailableError,
    UnsupportedClockError,
)
from perseus_client.gpu.applied import (
    AppliedClockReport,
    AppliedClockTally,
    OffPlanInstruction,
)
from perseus_client.gpu.base import DeviceIdentity, GpuBackend
from perseus_client.gpu.daemon_connection import GpudConnection
from perseus_client.gpu.discovery import discover_gpu
from perseus_common.gpud_wire import socket_path
from perseus_common.proto import gpud_pb2

__all__ = ["DaemonGpu", "AppliedClockReport", "OffPlanInstruction"]

log = logging.getLogger("perseus_client.gpu.daemon")

_NO_INDEX = 0xFFFFFFFF  # a uint32 no daemon manages (see DaemonGpu.__init__)


def _lease_tag(value: str) -> str:
    """A job or tenant label as the daemon accepts it: printable, at most 128 characters."""
    return "".join(c for c in value if c.isprintable())[:128]


class DaemonGpu(GpuBackend):
    """This process's GPU through the node daemon (see the module docstring).

    Args:
        index: the GPU's NVML index on this node (default: discovered).
        uuid: the GPU's UUID (``GPU-...``; default: discovered); wins over ``index``.
        socket: the daemon's socket (default ``$PERSEUS_GPUD_SOCKET`` or ``/run/perseus/gpud.sock``).
        timeout: seconds one call may take before the daemon is considered gone.
        connect_timeout: seconds construction waits for the daemon to be reachable.
        sample_interval: seconds between samples (heartbeats; at most a quarter of the lease timeout).
        retry_initial, retry_max: reconnection backoff bounds (seconds).
        job, tenant: the Perseus job and tenant named to the daemon at lease time, labels of the
            lease in its status and metrics (default ``$PERSEUS_JOB``, ``$PERSEUS_TENANT``).
    """

    synchronous_clocks = False
    samples_itself = True

    def __init__(
        self,
        index: int | None = None,
        *,
        uuid: str | None = None,
        socket: str | None = None,
        timeout: float = 2.0,
        connect_timeout: float = 5.0,
        sample_interval: float = 0.05,
        retry_initial: float = 0.05,
        retry_max: float = 1.0,
        job: str | None = None,
        tenant: str | None = None,
    ) -> None:
        if index is not None and index < 0:
            raise ValueError(f"index: must be >= 0, got {index}")
        if index is None and uuid is None:
            chosen = discover_gpu()
            index, uuid = chosen.index, chosen.uuid
        #: The GPU's NVML index (as the daemon reports it once leased).
        self.index = int(index) if index is not None else 0
        # Named by UUID only: send an index no daemon manages, so that a daemon too old to read
        # the UUID refuses (NOT_FOUND) rather than leasing GPU 0.
        self._wire_index = int(index) if index is not None else _NO_INDEX
        #: The GPU's UUID (``None`` until leased when only an index was given; an older daemon
        #: reports none).
        self.uuid: str | None = uuid
        self.socket = socket_path(socket)
        #: The Perseus job and tenant told to the daemon at lease time (labels of the lease in
        #: its status and metrics): ``job=``/``tenant=``, else ``$PERSEUS_JOB``/``$PERSEUS_TENANT``.
        self.job = _lease_tag(job if job is not None else os.environ.get("PERSEUS_JOB", ""))
        self.tenant = _lease_tag(
            tenant if tenant is not None else os.environ.get("PERSEUS_TENANT", "")
        )
        self.timeout = float(timeout)
        self._retry_initial = float(retry_initial)
        self._retry_max = float(retry_max)
        self._op_lock = threading.RLock()  # orders lock/reset/re-lease; guards _conn, _desired
        self._desired: int | None = None  # the clock last requested (None: reset)
        self._last_energy = 0
        self._outage = False
        #: How many times the GPU was leased again after losing the daemon.
        self.reconnects = 0
        self._closing = threading.Event()

        deadline = time.monotonic() + float(connect_timeout)
        delay = self._retry_initial
        while True:
            try:
                conn, lease = self._lease()
                break
            except GpudUnavailableError:
                if time.monotonic() + delay > deadline:
                    raise
                time.sleep(delay)
                delay = min(2 * delay, self._retry_max)
        self._conn: GpudConnection | None = conn
        self.index = self._wire_index = int(lease.gpu.index)
        self.uuid = str(lease.gpu.uuid) or None
        self.name = lease.gpu.name
        self._clocks = tuple(int(c) for c in lease.gpu.supported_clocks_mhz)
        self._max_power = float(lease.gpu.max_power_limit_w) or None  # 0: the daemon cannot tell
        self._floor_why = str(lease.gpu.floor_unavailable) or None
        self._tally = AppliedClockTally(self._clocks)
        #: True when the daemon runs ``--read-only`` (it never applies a clock).
        self.read_only = bool(lease.read_only)
        #: The daemon's lease timeout, seconds.
        self.lease_timeout = float(lease.lease_timeout_s)
        self.sample_interval = min(float(sample_interval), self.lease_timeout / 4)
        self._energy_now(conn)
        self._thread = threading.Thread(
            target=self._run, name=f"perseus-gpud-{self.index}", daemon=True
        )
        self._thread.start()

    # -- connection -------------------------------------------------------------------------------

    def _ref(self) -> gpud_pb2.GpuRef:
        return gpud_pb2.GpuRef(index=self._wire_index, uuid=self.uuid or "")

    def _lease(self) -> tuple[GpudConnection, gpud_pb2.Lease]:
        conn = GpudConnection(self.socket, timeout=self.timeout)
        try:
            ref = self._ref()
            ref.job, ref.tenant = self.job, self.tenant  # older daemons ignore both
            return conn, conn.call(lease=ref).lease
        except BaseException:
            conn.close()
            raise

    @property
    def connected(self) -> bool:
        """True while the GPU is leased on a live connection to the daemon."""
        return self._conn is not None

    def _lost(self, conn: GpudConnection, exc: BaseException) -> None:
        with self._op_lock:
            if self._conn is conn:
                self._conn = None
            conn.close()
            if not self._outage:
                self._outage = True
                log.warning(
                    "perseus: lost the node daemon at %s (%s); training goes on without clock "
                    "changes, and GPU %d will be leased again when the daemon is back",
                    self.socket,
                    exc,
                    self.index,
                )

    def _reconnect(self) -> bool:
        try:
            conn, _ = self._lease()
        except GpudError as exc:
            log.debug("perseus: node daemon not back yet: %s", exc)
            return False
        try:
            with self._op_lock:
                if self._desired is not None:
                    conn.call(
                        set_clock=gpud_pb2.SetClock(
                            index=self._wire_index, uuid=self.uuid or "", mhz=self._desired
                        )
                    )
                self._conn = conn
        except GpudError as exc:
            conn.close()
            log.debug("perseus: could not restore the clock after re-leasing: %s", exc)
            return False
        self.reconnects += 1
        self._outage = False
        log.warning("perseus: the node daemon is back; GPU %d leased again", self.index)
        return True

    def _run(self) -> None:
        delay = self._retry_initial
        wait = self.sample_interval
        while not self._closing.wait(wait):
            conn = self._conn
            if conn is None:
                if self._reconnect():
                    delay, wait = self._retry_initial, self.sample_interval
                else:
                    wait, delay = delay, min(2 * delay, self._retry_max)
                continue
            wait = self.sample_interval
            try:
                self._record(conn.call(sample=self._ref()).sample)
            except GpudUnavailableError as exc:
                self._lost(conn, exc)
                wait = 0.0
            except GpudRefusedError as exc:  # pragma: no cover - a sample needs no lease
                log.debug("perseus: sample refused: %s", exc)

    # -- GpuBackend -------------------------------------------------------------------------------

    def identity(self) -> DeviceIdentity:
        """The GPU's index and UUID as the daemon leased it (its device node is the daemon's)."""
        return DeviceIdentity(self.index, self.uuid)

    def supported_clocks(self) -> tuple[int, ...]:
        """Supported SM clocks (MHz), highest first, as the daemon told them."""
        return self._clocks

    def max_power_limit_w(self) -> float | None:
        """The maximum power limit the daemon read from NVML when it leased the GPU."""
        return self._max_power

    def set_locked_clocks(self, mhz: int) -> None:
        """Ask the daemon to lock the SM clock at ``mhz``; raises when ``mhz`` is not supported."""
        mhz = int(mhz)
        if mhz not in self._clocks:
            raise UnsupportedClockError(
                f"frequency_mhz: {mhz} MHz is not a supported SM clock of GPU {self.index} "
                f"({self.name}); supported: {self._clocks[0]}..{self._clocks[-1]} MHz"
            )
        request = gpud_pb2.Request(
            set_clock=gpud_pb2.SetClock(index=self._wire_index, uuid=self.uuid or "", mhz=mhz)
        )
        self._apply(mhz, request)

    def reset_locked_clocks(self) -> None:
        """Ask the daemon to remove the SM clock lock."""
        self._apply(None, gpud_pb2.Request(reset_clock=self._ref()))

    def _apply(self, mhz: int | None, request: gpud_pb2.Request) -> None:
        call = request.WhichOneof("call")
        assert call is not None
        with self._op_lock:
            self._desired = mhz
            conn = self._conn
            if conn is None:
                return  # applied when the daemon is back
            try:
                conn.call(**{call: getattr(request, call)})
            except GpudUnavailableError as exc:
                self._lost(conn, exc)

    def floor_unavailable(self) -> str | None:
        """Why the daemon's GPU cannot hold a floor (as told at lease time); None: it can."""
        return self._floor_why

    def set_power_floor(self, watts: float, ramp_w_per_s: float = 0.0) -> bool:
        """Ask the daemon to hold ``watts`` (0: release); False when it did not.

        The daemon releases the floor when this lease ends, however the process ends.
        """
        if self._floor_why is not None:
            return False
        with self._op_lock:
            conn = self._conn
            if conn is None:
                return False  # no daemon now: the floor ended with the lease
            floor = gpud_pb2.SetPowerFloor(
                index=self._wire_index,
                uuid=self.uuid or "",
                watts=float(watts),
                ramp_w_per_s=float(ramp_w_per_s),
            )
            try:
                state = conn.call(set_power_floor=floor).power_floor
            except GpudUnavailableError as exc:
                self._lost(conn, exc)
                return False
            except GpudRefusedError as exc:  # an older daemon, a bad value: floors off
                self._floor_why = f"the node daemon refused the floor: {exc}"
                return False
        if not state.applied:
            self._floor_why = state.unavailable or "the node daemon did not apply the floor"
        return bool(state.applied)

    def energy_mj(self) -> int:
        """The energy counter (mJ) through the daemon; the last value while it is unreachable."""
        conn = self._conn
        if conn is not None:
            self._energy_now(conn)
        return self._last_energy

    def _energy_now(self, conn: GpudConnection) -> None:
        try:
            self._last_energy = int(conn.call(energy=self._ref()).energy.energy_mj)
        except GpudUnavailableError as exc:
            self._lost(conn, exc)

    def close(self) -> None:
        """Stop the heartbeat thread and close the connection (the daemon resets the GPU)."""
        self._closing.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=self.timeout + 1.0)
        with self._op_lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    # -- applied clocks ---------------------------------------------------------------------------

    def _record(self, sample: gpud_pb2.Sample) -> None:
        instruction = self.running_instruction()
        if instruction is None or not sample.HasField("locked_mhz"):
            return
        self._tally.record(
            instruction, int(sample.locked_mhz), int(sample.sm_mhz), sample.reason_names
        )

    def take_applied_clocks(self) -> AppliedClockReport:
        """What the applied-clock samples showed since the previous call (see the module doc)."""
        return self._tally.take()
