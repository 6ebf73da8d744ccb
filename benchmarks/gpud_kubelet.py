"""How long a device-node owner waits for its gpud lease while a slow kubelet is being asked.

A real ``perseus gpud --simulate`` with ``--ownership auto`` and a kubelet stand-in (a real gRPC
``v1.PodResourcesLister`` on a Unix socket) that answers every ``List`` after ``--kubelet-delay``
seconds (2 by default). ``--pod-peers`` processes (12), each in a real cgroup at a kubelet pod
path, lease their pod's GPU, release it and lease again in a loop, so the kubelet is asked
whenever its cached answer has expired. Meanwhile a host process that holds its GPU's device
node open (no pod) leases and releases ``--owner-leases`` times (20); the table gives its lease
latency (connect + lease call) and the pod peers', and how many ``List`` calls were made.

Needs root (it starts a root daemon and writes cgroup v1 ``name=systemd``). ``--smoke`` is a
few seconds (``tests/gpud/test_ownership_kubelet.py`` runs it)::

    sudo .venv/bin/python benchmarks/gpud_kubelet.py [--kubelet-delay 2] [--pod-peers 12]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid as uuidlib
from concurrent import futures
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for _p in ("client", "gpud", "common"):
    sys.path.insert(0, str(ROOT / _p))

import grpc  # noqa: E402

from perseus_client.errors import GpudRefusedError  # noqa: E402
from perseus_client.gpu.daemon_connection import GpudConnection  # noqa: E402
from perseus_common.proto import gpud_pb2  # noqa: E402
from perseus_gpud import podresources_pb2, podresources_pb2_grpc  # noqa: E402
from perseus_gpud.simnvml import simulated_uuid  # noqa: E402

CGROUPS = Path("/sys/fs/cgroup/systemd")


class SlowKubelet(podresources_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, pods: list[tuple[str, str, str]], delay: float) -> None:
        self.pods = pods  # (namespace, name, GPU UUID)
        self.delay = delay
        self.calls = 0
        self._lock = threading.Lock()

    def List(  # noqa: N802 - the API's name
        self, request: podresources_pb2.ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> podresources_pb2.ListPodResourcesResponse:
        with self._lock:
            self.calls += 1
        time.sleep(self.delay)
        reply = podresources_pb2.ListPodResourcesResponse()
        for namespace, name, gpu in self.pods:
            c = reply.pod_resources.add(name=name, namespace=namespace).containers.add(name="t")
            c.devices.add(resource_name="nvidia.com/gpu", device_ids=[gpu])
        return reply


def _lease_once(sock: str, index: int) -> float:
    start = time.perf_counter()
    with GpudConnection(sock, timeout=30.0) as conn:
        try:
            conn.call(lease=gpud_pb2.GpuRef(index=index))
        except GpudRefusedError:
            return float("nan")  # refused (an old daemon's kubelet call timed out): counted
        return time.perf_counter() - start


def _child(args: argparse.Namespace) -> int:
    """A peer: lease GPU ``--index`` ``--count`` times (0: until stdin closes), print latencies."""
    device = open(args.device, "rb") if args.device else None  # noqa: SIM115
    sys.stdin.readline()  # "go": the parent placed this process in its cgroup
    out: list[float] = []
    n = 0
    while args.count == 0 or n < args.count:
        out.append(_lease_once(args.socket, args.index))
        n += 1
        time.sleep(args.pause)
        if args.count == 0 and os.path.exists(args.stop):
            break
    print(json.dumps(out), flush=True)
    if device is not None:
        device.close()
    return 0


def _spawn(sock: str, index: int, count: int, pause: float, stop: Path, device: str = "") -> Any:
    cmd = [sys.executable, __file__, "--child", "--socket", sock, "--index", str(index)]
    cmd += ["--count", str(count), "--pause", str(pause), "--stop", str(stop)]
    if device:
        cmd += ["--device", device]
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(str(ROOT / p) for p in ("client", "gpud", "common"))
    )
    return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)


def _row(name: str, xs: list[float]) -> str:
    ok = [x for x in xs if x == x]
    refused = len(xs) - len(ok)
    if not ok:
        return f"| {name} | 0 | {refused} | - | - | - |"
    p = sorted(ok)
    return (
        f"| {name} | {len(ok)} | {refused} | {statistics.median(ok) * 1e3:.1f} | "
        f"{p[int(0.9 * (len(p) - 1))] * 1e3:.1f} | {max(ok) * 1e3:.1f} |"
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="perseus-bench-gpud-"))
    work.chmod(0o755)
    pods = [(f"team-{i}", "train-0", str(uuidlib.uuid4())) for i in range(args.pod_peers)]
    for ns, name, uid in pods:
        (work / "pods" / f"{ns}_{name}_{uid}").mkdir(parents=True)
    n = args.pod_peers + 1
    kubelet = SlowKubelet(
        [(ns, name, simulated_uuid(i)) for i, (ns, name, _) in enumerate(pods)], args.kubelet_delay
    )
    ksock = work / "kubelet.sock"
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=64))
    podresources_pb2_grpc.add_PodResourcesListerServicer_to_server(kubelet, server)
    server.add_insecure_port(f"unix:{ksock}")
    server.start()
    sock = str(work / "gpud.sock")
    tree = Path(args.daemon_tree or ROOT)
    denv = dict(
        os.environ, PYTHONPATH=os.pathsep.join(str(tree / p) for p in ("client", "gpud", "common"))
    )
    cmd = [sys.executable, "-m", "perseus_gpud", "--socket", sock, "--simulate", str(n),
           "--kubelet-socket", str(ksock), "--pod-logs-dir", str(work / "pods"),
           "--log-level", "WARNING"]  # fmt: skip
    usage = subprocess.run([*cmd[:3], "--help"], env=denv, capture_output=True, text=True)
    if "--kubelet-timeout" in usage.stdout:  # an older daemon (--daemon-tree) has no such flag
        cmd += ["--kubelet-timeout", str(args.kubelet_delay + 3)]
    daemon = subprocess.Popen(cmd, env=denv, stderr=open(work / "gpud.log", "wb"))  # noqa: SIM115
    cgroups: list[Path] = []
    procs: list[Any] = []
    stop = work / "stop"
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(sock):
            if time.monotonic() > deadline or daemon.poll() is not None:
                raise SystemExit(f"gpud did not start: {(work / 'gpud.log').read_text()}")
            time.sleep(0.05)
        for i, (_, _, uid) in enumerate(pods):
            p = _spawn(sock, i, 0, 0.05, stop)
            d = CGROUPS / "kubepods" / "besteffort" / f"pod{uid}"
            d.mkdir(parents=True, exist_ok=True)
            cgroups.append(d)
            (d / "cgroup.procs").write_text(str(p.pid))
            procs.append(p)
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        time.sleep(min(1.0, args.kubelet_delay))  # the pod peers' first List is pending
        owner = _spawn(
            sock,
            n - 1,
            args.owner_leases,
            0.25,  # 20 leases span several expiries of the kubelet's cached answer
            stop,
            device=str(work / "gpud-dev" / f"nvidia{n - 1}"),
        )
        owner.stdin.write("go\n")
        owner.stdin.flush()
        owner_lat = json.loads(owner.stdout.readline())
        owner.wait()
        stop.touch()
        pod_lat: list[float] = []
        for p in procs:
            pod_lat += json.loads(p.stdout.readline())
            p.wait()
    finally:
        stop.touch()
        for p in procs:
            with contextlib.suppress(OSError):
                p.kill()
        daemon.terminate()
        daemon.wait(timeout=20)
        server.stop(None)
        for d in cgroups:
            with contextlib.suppress(OSError):
                (CGROUPS / "cgroup.procs").write_text("0")
                d.rmdir()
        for d in (CGROUPS / "kubepods" / "besteffort", CGROUPS / "kubepods"):
            with contextlib.suppress(OSError):
                d.rmdir()
        shutil.rmtree(work, ignore_errors=True)
    return {
        "kubelet_delay_s": args.kubelet_delay,
        "pod_peers": args.pod_peers,
        "list_calls": kubelet.calls,
        "owner_lease_s": owner_lat,
        "pod_lease_s": pod_lat,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kubelet-delay", type=float, default=2.0)
    ap.add_argument("--pod-peers", type=int, default=12)
    ap.add_argument("--owner-leases", type=int, default=20)
    ap.add_argument("--smoke", action="store_true", help="0.3 s kubelet, 3 pod peers, 3 leases")
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--daemon-tree",
        help="run the daemon from another checkout of this repository (a before/after figure)",
    )
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--socket", help=argparse.SUPPRESS)
    ap.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--pause", type=float, default=0.05, help=argparse.SUPPRESS)
    ap.add_argument("--stop", default="", help=argparse.SUPPRESS)
    ap.add_argument("--device", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return _child(args)
    if os.geteuid() != 0:
        print("gpud_kubelet.py: needs root (a root daemon, cgroups)", file=sys.stderr)
        return 2
    if args.smoke:
        args.kubelet_delay, args.pod_peers, args.owner_leases = 0.3, 3, 3
    res = run(args)
    if args.json:
        print(json.dumps(res))
        return 0
    print(
        f"kubelet answering in {res['kubelet_delay_s']} s, {res['pod_peers']} pod peers "
        f"leasing in a loop; {res['list_calls']} List calls"
    )
    print("| who | leases | refused | median ms | p90 ms | max ms |")
    print("|---|---|---|---|---|---|")
    print(_row("device-node owner (host process)", res["owner_lease_s"]))
    print(_row("pod peers (kubelet decides)", res["pod_lease_s"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
