"""A training process that locks clocks through ``perseus gpud`` (started by the gpud tests).

Started as root; imports everything it needs, then (``--uid``) drops to that unprivileged user
before it talks to the daemon: this machine's interpreter lives where other users cannot enter,
so nothing may be imported after ``setuid``. It runs a small plan of alternating clocks through a
``PerseusClient`` on a :class:`DaemonGpu`, writes one line per finished iteration to
``--progress`` (``<iteration> <pid> <uid>``), and logs to ``--log``. Before it leases, it opens
its GPU's simulated device node ``--device-dir``/``nvidia<gpu>`` (as CUDA opens
``/dev/nvidia<N>``), which is how the daemon knows the GPU is its own; ``--no-device`` skips it.

Exit status: 0 after ``--iterations`` iterations (0: run until killed), 3 when the daemon
refuses the lease (the message is logged).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

from perseus_client import DaemonGpu, PerseusClient
from perseus_client.errors import GpudRefusedError
from perseus_client.gpu.daemon_connection import GpudConnection  # noqa: F401 - preloaded for setuid
from perseus_common.proto import gpud_pb2
from perseus_common.wire.values import PlanStep, PlanUpdate

ORDER = [("forward", 0), ("forward", 1), ("backward", 0), ("backward", 1)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--uid", type=int)
    ap.add_argument("--gid", type=int)
    ap.add_argument("--clocks", default="1200,1005")
    ap.add_argument("--iterations", type=int, default=0)
    ap.add_argument("--instruction-seconds", type=float, default=0.005)
    ap.add_argument(
        "--hang-at", type=int, default=-1, help="iteration whose first instruction hangs"
    )
    ap.add_argument("--hang-seconds", type=float, default=0.0)
    ap.add_argument("--device-dir")
    ap.add_argument("--no-device", action="store_true")
    ap.add_argument("--progress", required=True)
    ap.add_argument("--log", required=True)
    args = ap.parse_args()
    log_file = open(args.log, "a", buffering=1)  # noqa: SIM115 - kept open for the whole run
    progress = open(args.progress, "a", buffering=1)  # noqa: SIM115
    logging.basicConfig(level=logging.INFO, stream=log_file, format="%(levelname)s %(message)s")
    # Exercise the protobuf runtime once so nothing is loaded lazily after setuid.
    gpud_pb2.Response.FromString(gpud_pb2.Response(id=1).SerializeToString())
    device = None
    if args.device_dir and not args.no_device:
        device = open(os.path.join(args.device_dir, f"nvidia{args.gpu}"), "rb")  # noqa: SIM115
    if args.uid is not None:
        gid = args.gid if args.gid is not None else args.uid
        os.setgroups([])
        os.setgid(gid)
        os.setuid(args.uid)
    clocks = [int(c) for c in args.clocks.split(",")]
    try:
        gpu = DaemonGpu(args.gpu, socket=args.socket, sample_interval=0.02)
    except GpudRefusedError as exc:
        logging.error("refused: %s: %s", exc.code, exc)
        return 3
    client = PerseusClient(offline=True, gpu=gpu, handle_signals=False)
    client.use_plan(
        PlanUpdate(
            1, tuple(PlanStep(k, m, clocks[i % len(clocks)], 0) for i, (k, m) in enumerate(ORDER))
        )
    )
    logging.info("trainer pid %d uid %d on GPU %d", os.getpid(), os.getuid(), args.gpu)
    it = 0
    while args.iterations == 0 or it < args.iterations:
        with client.iteration():
            for n, (kind, mb) in enumerate(ORDER):
                with client.instruction(kind, microbatch=mb):
                    if it == args.hang_at and n == 0:
                        time.sleep(args.hang_seconds)  # a long collective on the training thread
                    time.sleep(args.instruction_seconds)
        progress.write(f"{it} {os.getpid()} {os.getuid()}\n")
        it += 1
    client.close()
    gpu.close()
    if device is not None:
        device.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
