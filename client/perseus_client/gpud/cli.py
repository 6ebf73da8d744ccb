"""``perseus gpud``: the command line of the node daemon (``serve``, the default, and ``status``).

::

    perseus gpud [serve] [--socket PATH] [--gpus 0,1,...] [--allow-uid UID ...]
                 [--allow-gid GID ...] [--group GROUP] [--lease-timeout SECONDS]
                 [--simulate N [--state FILE] [--simulate-throttle FILE]] [--read-only]
    perseus gpud status [--socket PATH] [--json]

Also ``python -m perseus_client.gpud ...``. :func:`main` takes the arguments after ``gpud`` and
returns the exit status: 0, 1 when the daemon cannot be reached (``status``), 2 for bad
arguments or a daemon that cannot start.
"""

from __future__ import annotations

import argparse
import asyncio
import grp
import json
import logging
import signal
import sys
from typing import Any

from perseus_client.errors import GpuError
from perseus_client.gpud.connection import GpudConnection
from perseus_client.gpud.protocol import DEFAULT_SOCKET, SOCKET_ENV, GpudError, socket_path
from perseus_common.proto import gpud_pb2

__all__ = ["main", "status_rows"]

log = logging.getLogger("perseus_client.gpud")


def _indices(text: str) -> list[int]:
    try:
        out = [int(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected GPU indices like 0,1,3, got {text!r}") from exc
    if not out or any(i < 0 for i in out) or len(set(out)) != len(out):
        raise argparse.ArgumentTypeError(f"expected distinct GPU indices >= 0, got {text!r}")
    return out


def _gid(text: str) -> int:
    if text.isdigit():
        return int(text)
    try:
        return grp.getgrnam(text).gr_gid
    except KeyError as exc:
        raise argparse.ArgumentTypeError(f"no group named {text!r}") from exc


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _serve_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="perseus gpud",
        description="The Perseus node daemon: unprivileged trainers lock GPU clocks through it; "
        "a GPU whose holder dies is reset.",
    )
    p.add_argument(
        "--socket", help=f"Unix socket to serve (default ${SOCKET_ENV} or {DEFAULT_SOCKET})"
    )
    p.add_argument("--gpus", type=_indices, help="NVML indices to manage (default: all)")
    p.add_argument(
        "--allow-uid", type=int, action="append", default=[], metavar="UID", help="allowed uid"
    )
    p.add_argument(
        "--allow-gid",
        type=_gid,
        action="append",
        default=[],
        metavar="GID",
        help="allowed group (gid or name; primary or supplementary)",
    )
    p.add_argument("--group", type=_gid, help="group owning the socket (mode 0660)")
    p.add_argument(
        "--lease-timeout",
        type=_positive,
        default=5.0,
        metavar="SECONDS",
        help="a client silent this long loses its GPUs (default 5)",
    )
    p.add_argument("--simulate", type=int, metavar="N", help="serve N simulated GPUs")
    p.add_argument("--state", metavar="FILE", help="with --simulate: keep GPU state in FILE")
    p.add_argument(
        "--simulate-throttle",
        metavar="FILE",
        help="with --simulate: JSON of injected throttling, re-read when it changes",
    )
    p.add_argument(
        "--read-only", action="store_true", help="never set or reset a clock; log what it would do"
    )
    p.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    return p


def _serve(argv: list[str]) -> int:
    args = _serve_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if args.simulate is None and (args.state or args.simulate_throttle):
        print("perseus gpud: --state and --simulate-throttle need --simulate N", file=sys.stderr)
        return 2
    from perseus_client.gpud.devices import open_gpus
    from perseus_client.gpud.server import GpudServer, GpudStartError, PeerPolicy

    nvml: Any
    if args.simulate is not None:
        from perseus_client.gpud.simnvml import SimulatedNvml

        if args.simulate < 1:
            print("perseus gpud: --simulate needs N >= 1", file=sys.stderr)
            return 2
        nvml = SimulatedNvml(
            args.simulate, state_path=args.state, throttle_path=args.simulate_throttle
        )
    else:
        import pynvml

        nvml = pynvml
    try:
        gpus = open_gpus(nvml, args.gpus, read_only=args.read_only)
    except GpuError as exc:
        print(f"perseus gpud: {exc}", file=sys.stderr)
        return 2
    policy = PeerPolicy(frozenset(args.allow_uid), frozenset(args.allow_gid))
    if not policy.uids and not policy.gids:
        log.warning("no --allow-uid/--allow-gid given: only root may lease GPUs")
    server = GpudServer(
        gpus, policy=policy, lease_timeout=args.lease_timeout, read_only=args.read_only
    )

    async def run() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, server.stop)
        await server.serve(socket_path(args.socket), gid=args.group)

    try:
        asyncio.run(run())
    except GpudStartError as exc:
        print(f"perseus gpud: {exc}", file=sys.stderr)
        return 2
    finally:
        for gpu in gpus:
            gpu.close()
    return 0


def status_rows(path: str | None = None, *, timeout: float = 5.0) -> list[dict[str, Any]]:
    """The daemon's status as ``gpud status --json`` prints it: one dict per GPU with ``index``,
    ``name``, ``locked_mhz`` (``None`` when reset) and ``holder`` (``None`` or ``{"pid", "uid"}``)."""
    with GpudConnection(path, timeout=timeout) as conn:
        status = conn.call(status=gpud_pb2.Empty()).status
    return [
        {
            "index": g.index,
            "name": g.name,
            "locked_mhz": g.locked_mhz if g.HasField("locked_mhz") else None,
            "holder": {"pid": g.holder.pid, "uid": g.holder.uid} if g.HasField("holder") else None,
        }
        for g in status.gpus
    ]


def _status(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="perseus gpud status", description="Show the daemon's GPUs.")
    p.add_argument(
        "--socket", help=f"the daemon's socket (default ${SOCKET_ENV} or {DEFAULT_SOCKET})"
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    args = p.parse_args(argv)
    try:
        rows = status_rows(args.socket)
    except GpudError as exc:
        print(f"perseus gpud status: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(rows))
        return 0
    print(f"{'GPU':>3}  {'name':36}  {'locked':>8}  holder")
    for r in rows:
        locked = "none" if r["locked_mhz"] is None else f"{r['locked_mhz']} MHz"
        h = r["holder"]
        holder = "none" if h is None else f"pid {h['pid']} uid {h['uid']}"
        print(f"{r['index']:>3}  {r['name'][:36]:36}  {locked:>8}  {holder}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run ``perseus gpud`` with ``argv`` (the arguments after ``gpud``); return the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["status"]:
        return _status(argv[1:])
    if argv[:1] == ["serve"]:
        argv = argv[1:]
    return _serve(argv)
