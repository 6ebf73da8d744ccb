"""A scriptable daemon peer for the gpud tests.

A real process, optionally unprivileged, that opens connections and leases as told on stdin and
answers one JSON line per command on stdout.

    python peer.py --socket S [--uid U --gid G [--groups G1,G2]] [--device FILE]

``--device`` opens that (simulated) device node first, as CUDA would. Everything is imported
before ``setuid`` (this machine's interpreter lives where other users cannot enter). Commands:

- ``connect N``: open N more connections and send a heartbeat on each;
  ``{"open": k, "busy": b}``: ``b`` of them were answered ``BUSY`` and closed;
- ``lease REF`` (``GPU-...`` or an index) on connection 0: ``{"ok": true, "uuid": ...}`` or
  ``{"code": ..., "message": ...}``; ``lock MHZ``: lock the leased GPU's clock. Once it holds a
  lease the peer heartbeats on that connection every quarter of the daemon's lease timeout, as
  the client's daemon backend does: the lease lives until the peer exits or closes it, however
  long the test takes between two commands (a peer that never heartbeated lost its lease after
  5 s, while the test started another peer on a loaded machine);
- ``fork``: fork a child that keeps heartbeating on connection 0 every 0.2 s until killed (the
  parent stops heartbeating first); ``{"child": pid}``;
- ``status``: the GPUs the daemon shows this peer ``{"gpus": [index, ...], "holders": [...]}``;
  ``sample REF``: ``{"ok": true, "sm_mhz": ...}`` or ``{"code": ..., "message": ...}``;
- ``lease REF JOB TENANT``: a lease naming a Perseus job and tenant;
- ``open``: how many connections the daemon has not closed ``{"open": k}``;
- ``floor WATTS RAMP``: hold a power floor on the leased GPU: ``{"applied": ..., "watts": ...,
  "unavailable": ...}`` or ``{"code": ..., "message": ...}``;
- ``exit``: exit at once (without closing anything first).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import socket
import struct
import sys
import threading
import time

from perseus_client.errors import GpudRefusedError
from perseus_client.gpu.daemon_connection import GpudConnection
from perseus_common.gpud_wire import encode_frame, read_frame
from perseus_common.proto import gpud_pb2


def _admitted(sock: socket.socket) -> bool:
    """Whether the daemon kept this connection.

    A heartbeat is answered (True), or the daemon sent BUSY and closed it (False).
    """
    request = gpud_pb2.Request(id=7, heartbeat=gpud_pb2.Empty()).SerializeToString()
    sock.settimeout(30.0)
    with contextlib.suppress(OSError):  # already closed: its BUSY frame is still there to read
        sock.sendall(encode_frame(request))
    try:
        reply = gpud_pb2.Response.FromString(read_frame(sock))
    except (OSError, ConnectionError):
        return False
    if reply.HasField("error"):
        assert reply.error.code == gpud_pb2.BUSY, reply
        return False
    return reply.id == 7


def _closed(sock: socket.socket) -> bool:
    """Whether the daemon has closed the connection (or sent it a closing error) by now."""
    ready, _, _ = select.select([sock], [], [], 0.0)
    if not ready:
        return False
    try:
        data = sock.recv(65536, socket.MSG_PEEK)
    except OSError:
        return True
    if not data:
        return True
    (size,) = struct.unpack(">I", data[:4])
    reply = gpud_pb2.Response.FromString(data[4 : 4 + size])
    return reply.error.code in (gpud_pb2.BUSY, gpud_pb2.TIMEOUT)


class _Heartbeat:
    """Heartbeats on a leased connection every ``interval`` seconds until stopped."""

    def __init__(self, conn: GpudConnection, interval: float) -> None:
        self.conn = conn
        self.interval = interval
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopped.wait(self.interval):
            try:
                self.conn.call(heartbeat=gpud_pb2.Empty())
            except Exception:  # noqa: BLE001 - the connection is gone: nothing left to keep
                return

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join()


def _ref(ref: str) -> gpud_pb2.GpuRef:
    return gpud_pb2.GpuRef(uuid=ref) if ref.startswith("GPU-") else gpud_pb2.GpuRef(index=int(ref))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--uid", type=int)
    ap.add_argument("--gid", type=int)
    ap.add_argument("--device")
    ap.add_argument("--groups", default="", help="supplementary gids, comma-separated")
    args = ap.parse_args()
    gpud_pb2.Response.FromString(gpud_pb2.Response(id=1).SerializeToString())
    json.dumps({})
    device = open(args.device, "rb") if args.device else None  # noqa: SIM115
    if args.uid is not None:
        os.setgroups([int(g) for g in args.groups.split(",") if g])
        os.setgid(args.gid if args.gid is not None else args.uid)
        os.setuid(args.uid)
    conns: list[socket.socket] = []
    leased: GpudConnection | None = None
    heartbeat: _Heartbeat | None = None
    uuid = ""

    def reply(obj: object) -> None:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    for line in sys.stdin:
        cmd, *rest = line.split()
        if cmd == "connect":
            opened, busy = 0, 0
            for _ in range(int(rest[0])):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.connect(args.socket)
                conns.append(s)
                opened += 1
            for s in conns[-opened:]:
                busy += not _admitted(s)
            reply({"open": opened, "busy": busy})
        elif cmd in ("status", "sample"):
            with GpudConnection(args.socket) as one:
                try:
                    if cmd == "status":
                        gpus = one.call(status=gpud_pb2.Empty()).status.gpus
                        holders = [g.holder.pid for g in gpus if g.HasField("holder")]
                        reply({"gpus": [g.index for g in gpus], "holders": holders})
                    else:
                        s = one.call(sample=_ref(rest[0])).sample
                        reply({"ok": True, "sm_mhz": s.sm_mhz})
                except GpudRefusedError as exc:
                    reply({"code": exc.code, "message": str(exc)})
        elif cmd == "lease":
            leased = leased or GpudConnection(args.socket)
            gref = _ref(rest[0])
            if len(rest) == 3:
                gref.job, gref.tenant = rest[1], rest[2]
            try:
                lease = leased.call(lease=gref).lease
                uuid = lease.gpu.uuid
                if heartbeat is None and lease.lease_timeout_s > 0:
                    heartbeat = _Heartbeat(leased, lease.lease_timeout_s / 4)
                reply({"ok": True, "uuid": uuid, "index": lease.gpu.index})
            except GpudRefusedError as exc:
                reply({"code": exc.code, "message": str(exc)})
        elif cmd == "lock":
            assert leased is not None
            leased.call(set_clock=gpud_pb2.SetClock(uuid=uuid, mhz=int(rest[0])))
            reply({"ok": True})
        elif cmd == "floor":
            assert leased is not None
            req = gpud_pb2.SetPowerFloor(
                uuid=uuid, watts=float(rest[0]), ramp_w_per_s=float(rest[1])
            )
            try:
                st = leased.call(set_power_floor=req).power_floor
                reply({"applied": st.applied, "watts": st.watts, "unavailable": st.unavailable})
            except GpudRefusedError as exc:
                reply({"code": exc.code, "message": str(exc)})
        elif cmd == "fork":
            assert leased is not None
            if heartbeat is not None:  # the child heartbeats instead: one reader per socket
                heartbeat.stop()
                heartbeat = None
            sock = leased._sock
            assert sock is not None
            pid = os.fork()
            if pid == 0:  # the child: heartbeat on the inherited socket until killed
                sys.stdin.close()
                while True:
                    try:
                        sock.sendall(
                            encode_frame(
                                gpud_pb2.Request(heartbeat=gpud_pb2.Empty()).SerializeToString()
                            )
                        )
                        read_frame(sock)
                    except OSError:
                        os._exit(0)
                    time.sleep(0.2)
            reply({"child": pid})
        elif cmd == "open":
            reply({"open": sum(not _closed(s) for s in conns)})
        elif cmd == "exit":
            os._exit(0)
    if device is not None:
        device.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
