"""``perseus gpud``: the command line of the node daemon (``serve``, the default, and ``status``).

::

    perseus gpud [serve] [--socket PATH] [--gpus 0,1,...] [--allow-uid UID ...]
                 [--allow-gid GID ...] [--admin-gid GID ...] [--group GROUP] [--lease-timeout SECONDS] [--state FILE]
                 [--ownership auto|device-node|pod-resources|none[,...]] [--kubelet-socket PATH]
                 [--kubelet-timeout S] [--kubelet-cache S] [--pod-logs-dir DIR]
                 [--max-connections N] [--max-connections-per-uid N]
                 [--reserved-connections N] [--idle-timeout S] [--frame-timeout S]
                 [--metrics-port PORT] [--metrics-textfile FILE] [--metrics-interval S]
                 [--simulate N [--simulate-state FILE] [--simulate-dev-dir DIR]
                  [--simulate-throttle FILE] [--simulate-smoothing]] [--read-only]
    perseus gpud status [--socket PATH] [--json]

Also ``python -m perseus_gpud ...``. :func:`main` takes the arguments after ``gpud`` and
returns the exit status: 0, 1 when the daemon cannot be reached (``status``), 2 for bad
arguments or a daemon that cannot start (a malformed ``--state`` or ``--simulate-state`` file
included: the message names the file and the problem).
"""

from __future__ import annotations

import argparse
import asyncio
import grp
import json
import logging
import os
import signal
import sys
from typing import Any

from perseus_client.errors import GpudError, GpuError
from perseus_client.gpu.daemon_connection import GpudConnection
from perseus_common.gpud_wire import DEFAULT_SOCKET, SOCKET_ENV, socket_path
from perseus_common.proto import gpud_pb2
from perseus_gpud.ownership import DEFAULT_KUBELET_SOCKET, DEFAULT_POD_LOGS

__all__ = ["main", "status_rows"]

log = logging.getLogger("perseus_gpud")


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


def _count(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return value


_MECHANISMS = ("device-node", "pod-resources")


def _ownership(text: str) -> str:
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if parts in (["auto"], ["none"]) or (parts and all(p in _MECHANISMS for p in parts)):
        return ",".join(parts)
    raise argparse.ArgumentTypeError(
        f"expected auto, none, or device-node and/or pod-resources, got {text!r}"
    )


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _ownership_options(p: argparse.ArgumentParser) -> None:
    """The options of the ownership check (docs/gpud.md, "Ownership")."""
    p.add_argument(
        "--ownership",
        type=_ownership,
        default="auto",
        help="how a peer's ownership of a GPU is checked: device-node, pod-resources (both "
        "comma-separated), auto (device-node, plus pod-resources when the kubelet socket "
        "exists; the default) or none (any allowed peer may lease any GPU)",
    )
    p.add_argument("--kubelet-socket", default=DEFAULT_KUBELET_SOCKET, metavar="PATH")
    p.add_argument(
        "--kubelet-timeout",
        type=_positive,
        default=2.0,
        metavar="SECONDS",
        help="how long a pod-resources List call may take (default 2; no answer: refused)",
    )
    p.add_argument(
        "--kubelet-cache",
        type=_positive,
        default=2.0,
        metavar="SECONDS",
        help="how long the kubelet's answer is used for, by every lease meanwhile (default 2)",
    )
    p.add_argument("--pod-logs-dir", default=DEFAULT_POD_LOGS, metavar="DIR")


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
    p.add_argument(
        "--admin-gid",
        type=_gid,
        action="append",
        default=[],
        metavar="GID",
        help="a group whose members see every GPU in status and samples, as root does (others "
        "see only the GPUs they lease or own)",
    )
    p.add_argument("--group", type=_gid, help="group owning the socket (mode 0660)")
    p.add_argument(
        "--lease-timeout",
        type=_positive,
        default=5.0,
        metavar="SECONDS",
        help="a client silent this long loses its GPUs (default 5)",
    )
    p.add_argument(
        "--state",
        metavar="FILE",
        help="gpud's record of the clocks it locked, reset at start after a crash (default "
        "gpud.state.json next to the socket)",
    )
    _ownership_options(p)
    p.add_argument("--max-connections", type=_count, default=512, metavar="N")
    p.add_argument("--max-connections-per-uid", type=_count, default=64, metavar="N")
    p.add_argument(
        "--reserved-connections",
        type=int,
        default=32,
        metavar="N",
        help="of --max-connections, kept for peers allowed to lease (default 32)",
    )
    p.add_argument(
        "--idle-timeout",
        type=_positive,
        default=60.0,
        metavar="SECONDS",
        help="close a connection holding no lease after this long without a request (60)",
    )
    p.add_argument(
        "--frame-timeout",
        type=_positive,
        default=5.0,
        metavar="SECONDS",
        help="a request frame must be complete this long after its first byte (5)",
    )
    p.add_argument(
        "--metrics-port", type=int, metavar="PORT", help="serve Prometheus metrics on 127.0.0.1"
    )
    p.add_argument(
        "--metrics-textfile",
        metavar="FILE",
        help="write Prometheus metrics to FILE (node-exporter's textfile collector)",
    )
    p.add_argument("--metrics-interval", type=_positive, default=10.0, metavar="SECONDS")
    p.add_argument("--simulate", type=int, metavar="N", help="serve N simulated GPUs")
    p.add_argument(
        "--simulate-state", metavar="FILE", help="with --simulate: keep GPU state in FILE"
    )
    p.add_argument(
        "--simulate-dev-dir",
        metavar="DIR",
        help="with --simulate: directory of files nvidia<N> standing in for the device nodes "
        "(default gpud-dev next to the socket)",
    )
    p.add_argument(
        "--simulate-throttle",
        metavar="FILE",
        help="with --simulate: JSON of injected throttling, re-read when it changes",
    )
    p.add_argument(
        "--simulate-smoothing",
        action="store_true",
        help="with --simulate: the GPUs have NVML power smoothing (they can hold power floors)",
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
    if args.simulate is None and (
        args.simulate_state
        or args.simulate_throttle
        or args.simulate_dev_dir
        or args.simulate_smoothing
    ):
        print(
            "perseus gpud: --simulate-state, --simulate-dev-dir, --simulate-throttle and "
            "--simulate-smoothing need --simulate N",
            file=sys.stderr,
        )
        return 2
    try:
        return _run_daemon(args)
    except (ValueError, OSError) as exc:  # bad files and limits: a message, not a traceback
        print(f"perseus gpud: {exc}", file=sys.stderr)
        return 2


def _build_ownership(args: argparse.Namespace, dev_dir: str | None) -> Any:
    from perseus_gpud.ownership import (
        DeviceNodeOwnership,
        Ownership,
        PodResourcesOwnership,
    )

    mechanisms = args.ownership.split(",")
    if mechanisms == ["none"]:
        return Ownership()
    if mechanisms == ["auto"]:
        mechanisms = ["device-node"]
        if os.path.exists(args.kubelet_socket):
            mechanisms.append("pod-resources")
    return Ownership(
        DeviceNodeOwnership(dev_dir) if "device-node" in mechanisms else None,
        PodResourcesOwnership(
            args.kubelet_socket,
            args.pod_logs_dir,
            timeout=args.kubelet_timeout,
            ttl=args.kubelet_cache,
        )
        if "pod-resources" in mechanisms
        else None,
        pod_logs=args.pod_logs_dir,
    )


def _simulated_dev_dir(path: str, count: int) -> str:
    os.makedirs(path, mode=0o755, exist_ok=True)
    os.chmod(path, 0o755)
    for i in range(count):
        node = os.path.join(path, f"nvidia{i}")
        with open(node, "a"):
            pass
        os.chmod(node, 0o666)  # like /dev/nvidia<N> on a plain host: the runtime confines it
    return path


def _run_daemon(args: argparse.Namespace) -> int:
    from perseus_gpud.devices import open_gpus
    from perseus_gpud.limits import ConnectionLimits, raise_fd_limit
    from perseus_gpud.lockrecord import LockRecord
    from perseus_gpud.server import GpudServer, GpudStartError, PeerPolicy

    path = socket_path(args.socket)
    here = os.path.dirname(os.path.abspath(path))
    limits = ConnectionLimits(
        max_connections=args.max_connections,
        max_per_uid=args.max_connections_per_uid,
        reserved=args.reserved_connections,
        idle_timeout=args.idle_timeout,
        frame_timeout=args.frame_timeout,
    )
    if args.metrics_port is not None and not 0 <= args.metrics_port < 65536:
        raise ValueError(f"--metrics-port: expected 0..65535, got {args.metrics_port}")
    record = LockRecord(args.state or os.path.join(here, "gpud.state.json"))
    if args.metrics_textfile and os.path.dirname(os.path.abspath(args.metrics_textfile)) == here:
        log.warning(
            "--metrics-textfile %s is in the socket's directory: trainers that mount it can read "
            "every GPU's holder; put it where they cannot (node-exporter's textfile directory)",
            args.metrics_textfile,
        )
    nvml: Any
    dev_dir = None
    if args.simulate is not None:
        from perseus_gpud.simnvml import SimulatedNvml

        if args.simulate < 1:
            print("perseus gpud: --simulate needs N >= 1", file=sys.stderr)
            return 2
        nvml = SimulatedNvml(
            args.simulate,
            state_path=args.simulate_state,
            throttle_path=args.simulate_throttle,
            smoothing=args.simulate_smoothing,
        )
        dev_dir = _simulated_dev_dir(
            args.simulate_dev_dir or os.path.join(here, "gpud-dev"), args.simulate
        )
    else:
        nvml = None  # the vendor the availability probe finds (perseus_client.gpu.vendors)
    soft, hard = raise_fd_limit()
    log.info("open-file limit: %d (hard %d)", soft, hard)
    try:
        gpus = open_gpus(nvml, args.gpus, read_only=args.read_only, record=record)
    except GpuError as exc:
        print(f"perseus gpud: {exc}", file=sys.stderr)
        return 2
    policy = PeerPolicy(
        frozenset(args.allow_uid), frozenset(args.allow_gid), frozenset(args.admin_gid)
    )
    if not policy.uids and not policy.gids:
        log.warning("no --allow-uid/--allow-gid given: only root may lease GPUs")
    server = GpudServer(
        gpus,
        policy=policy,
        lease_timeout=args.lease_timeout,
        read_only=args.read_only,
        ownership=_build_ownership(args, dev_dir),
        record=record,
        limits=limits,
    )

    async def run() -> None:
        from perseus_gpud import metrics

        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, server.stop)
        extra: list[Any] = []
        if args.metrics_port is not None:
            http = await metrics.serve_http(server, args.metrics_port)
            extra.append(http)
            log.info("metrics on http://127.0.0.1:%d/metrics", args.metrics_port)
        if args.metrics_textfile:
            extra.append(
                asyncio.create_task(
                    metrics.write_textfile_forever(
                        server, args.metrics_textfile, args.metrics_interval
                    )
                )
            )
        try:
            await server.serve(path, gid=args.group)
        finally:
            for item in extra:
                if isinstance(item, asyncio.Task):
                    item.cancel()
                else:
                    item.close()

    try:
        asyncio.run(run())
    except GpudStartError as exc:
        print(f"perseus gpud: {exc}", file=sys.stderr)
        return 2
    finally:
        server.ownership.close()
        for gpu in gpus:
            gpu.close()
    return 0


def status_rows(path: str | None = None, *, timeout: float = 5.0) -> list[dict[str, Any]]:
    """The daemon's status as ``gpud status --json`` prints it: one dict per GPU.

    Each dict has ``index``, ``uuid``, ``name``, ``locked_mhz`` (``None`` when reset) and
    ``holder`` (``None`` or ``{"pid", "uid", "pod", "namespace", "slurm_job", "owned_by", "job",
    "tenant"}``, strings empty when unknown). Root sees every GPU; another user only the GPUs it
    leases or owns.
    """
    with GpudConnection(path, timeout=timeout) as conn:
        status = conn.call(status=gpud_pb2.Empty()).status
    return [
        {
            "index": g.index,
            "uuid": g.uuid,
            "name": g.name,
            "locked_mhz": g.locked_mhz if g.HasField("locked_mhz") else None,
            "holder": _holder(g.holder) if g.HasField("holder") else None,
        }
        for g in status.gpus
    ]


def _holder(h: gpud_pb2.Holder) -> dict[str, Any]:
    return {
        "pid": h.pid,
        "uid": h.uid,
        "pod": h.pod,
        "namespace": h.namespace,
        "slurm_job": h.slurm_job,
        "owned_by": h.owned_by,
        "job": h.job,
        "tenant": h.tenant,
    }


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
    print(f"{'GPU':>3}  {'uuid':40}  {'locked':>8}  holder")
    for r in rows:
        locked = "none" if r["locked_mhz"] is None else f"{r['locked_mhz']} MHz"
        h = r["holder"]
        holder = "none" if h is None else f"pid {h['pid']} uid {h['uid']}"
        if h is not None and h["pod"]:
            holder += f" pod {h['namespace']}/{h['pod']}"
        if h is not None and h["slurm_job"]:
            holder += f" slurm job {h['slurm_job']}"
        if h is not None and h["job"]:
            holder += f" perseus job {h['job']}" + (f" ({h['tenant']})" if h["tenant"] else "")
        print(f"{r['index']:>3}  {r['uuid'][:40]:40}  {locked:>8}  {holder}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run ``perseus gpud`` with ``argv`` (the arguments after ``gpud``); return the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["status"]:
        return _status(argv[1:])
    if argv[:1] == ["serve"]:
        argv = argv[1:]
    return _serve(argv)
