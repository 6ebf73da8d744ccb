r"""Online profiling with torch.distributed.pipelining, from nothing to a deployed plan.

What a new user does, in order, on one machine without a GPU:

1. start the server (``perseus serve``) - this script starts one on free ports unless you give
   ``--server``;
2. create the job over REST (``POST /jobs``) with the order exported from the torch schedule;
3. start the training ranks: each one builds its pipeline stage, creates a ``PerseusClient``
   (which registers the rank over gRPC) and instruments the schedule;
4. start online profiling (``POST /jobs/{id}/profiling``) and keep training: the server locks
   every rank at one SM clock after another and the clients report what each instruction took;
5. when the scan ends, the server stores the measured profile, solves the frontier and deploys
   its fastest plan by itself; the ranks pick it up at an iteration boundary and train on it;
6. read the result: ``GET /jobs/{id}/profiling``, ``/profile``, ``/frontier`` and ``/status``.

The GPUs are simulated (``SimulatedGpu``, a DVFS model of the shipped GPT-3 175B A100 profile);
on real GPUs drop ``gpu=`` and the client locks clocks through NVML (or the node daemon).

Run it (one command; it launches two ranks over gloo itself, like ``torchrun`` would)::

    python examples/torch_pipelining_online_profiling.py --short   # 4 clocks (what CI runs)
    python examples/torch_pipelining_online_profiling.py           # the default scan (longer)

or against a running server (``perseus serve``)::

    python examples/torch_pipelining_online_profiling.py --server http://localhost:8000 \
        --grpc localhost:50051

(a server with TLS and a private CA: ``--server https://host:8000 --grpc host:50051
--tls-ca ca.pem``, or ``PERSEUS_TLS_CA=ca.pem`` in the environment)

or under torchrun (then ``--server`` is required, and ``--nproc-per-node`` must be 2)::

    torchrun --nproc-per-node 2 examples/torch_pipelining_online_profiling.py --server ...

The walk-through of every step and parameter: docs/online-profiling.md.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
#: The profile the simulated GPUs follow (its first two stages), and what an A100 SXM draws
#: while it waits on a pipeline neighbour (watts).
PROFILE = ROOT / "profiles" / "gpt3-175b_a100-sxm_8stage.csv"
BLOCKING_POWER = 83.64
STAGES, MICROBATCHES, WIDTH = 2, 4, 32
#: Wall seconds per simulated second. The shortest instruction of this profile (a forward at
#: 1410 MHz, 50 ms) then lasts 12.5 ms of wall time, far more than the real work inside it (this
#: toy stage's forward is one 32 x 32 layer on a CPU). The rule: the real work inside
#: an instruction must take less than its scaled time, or the simulated GPU counts the real work
#: and every measured time comes out longer than the model.
TIME_SCALE = 0.25


# --- the launcher: a server, then two rank processes ---------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(args: argparse.Namespace, argv: list[str]) -> int:
    """Start ``perseus serve`` (unless ``--server`` names one), then the ranks; wait for them."""
    with tempfile.TemporaryDirectory(prefix="perseus-example-") as tmp:
        server = None
        if args.server is None:
            from perseus_server import ServerProcess  # runs `perseus serve` on free ports

            server = ServerProcess(Path(tmp) / "perseus.db", log_path=Path(tmp) / "server.log")
            server.start()
            rest, grpc_target = server.http_url, server.grpc_target
            print(f"example: started perseus serve: REST {rest}, gRPC {grpc_target}", flush=True)
        else:
            rest, grpc_target = args.server, args.grpc
        env = {
            **os.environ,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(_free_port()),
            "WORLD_SIZE": str(STAGES),
            "OMP_NUM_THREADS": "1",
            "CUDA_VISIBLE_DEVICES": "",
        }
        rank_args = _without_options(argv, ("--server", "--grpc"))
        cmd = [sys.executable, str(Path(__file__).resolve()), *rank_args]
        cmd += ["--server", rest, "--grpc", grpc_target]
        procs = [
            subprocess.Popen(cmd, env={**env, "RANK": str(r), "LOCAL_RANK": str(r)})
            for r in range(STAGES)
        ]
        deadline = time.monotonic() + args.timeout
        try:
            while any(p.poll() is None for p in procs):
                if any(p.poll() not in (None, 0) for p in procs):
                    break  # one rank failed: the other would wait for it forever
                if time.monotonic() > deadline:
                    print(f"example: the ranks did not finish in {args.timeout} s", flush=True)
                    break
                time.sleep(0.1)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                p.wait()
            if server is not None:
                server.stop()
        codes = [p.returncode for p in procs]
        if any(codes) and server is not None:
            print("example: the server's log:\n" + server.output()[-4000:], flush=True)
        return max(codes, key=abs)


def _without_options(argv: list[str], names: tuple[str, ...]) -> list[str]:
    """``argv`` without the options ``names`` (and their values)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in names:
            skip = True
        elif not any(a.startswith(n + "=") for n in names):
            out.append(a)
    return out


# --- one training rank ---------------------------------------------------------------------------


class Rest:
    """The server's REST API through the standard library, raising on any error.

    The error carries the server's answer; so a rank needs nothing beyond the light client and
    torch.
    """

    def __init__(self, base: str, tls_ca: str | None = None) -> None:
        from perseus_client.transport import tls_context

        self.base = base.rstrip("/")
        self.ssl = tls_context(tls_ca)  # --tls-ca, else $PERSEUS_TLS_CA, else the system's roots
        token = os.environ.get("PERSEUS_TOKEN")  # the same token the client reads
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}

    def __call__(
        self, method: str, path: str, *, json: Any = None, params: dict[str, str] | None = None
    ) -> Any:
        import json as json_
        import urllib.error
        import urllib.parse
        import urllib.request

        url = self.base + path + ("?" + urllib.parse.urlencode(params) if params else "")
        data = None if json is None else json_.dumps(json).encode()
        headers = {**self.headers, **({"Content-Type": "application/json"} if data else {})}
        req = urllib.request.Request(url, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(req, timeout=30, context=self.ssl) as r:
                body, kind = r.read().decode(), r.headers.get("Content-Type", "")
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"{method} {path}: {e.code} {e.read().decode()}") from None
        return json_.loads(body) if "json" in kind else body


def rank_main(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    from perseus_client import Connection, PerseusClient, RankPosition, SimulatedGpu
    from perseus_client.integrations import torch_pipelining

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if world != STAGES:
        raise SystemExit(f"this example runs {STAGES} ranks (one per stage), not {world}")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    api = Rest(args.server, args.tls_ca)

    def say(what: str) -> None:
        print(f"rank {rank}: {what}", flush=True)

    # The pipeline: stage `rank` of a two-stage model, driven by torch's 1F1B schedule.
    torch.manual_seed(rank)
    layer = torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh())
    stage = PipelineStage(layer, rank, STAGES, torch.device("cpu"))
    schedule = Schedule1F1B(stage, MICROBATCHES, loss_fn=lambda out, y: ((out - y) ** 2).mean())
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.01)

    # Step 2: rank 0 creates the job with the order torch will execute, and tells the others.
    # (Every rank computes the same order; any one of them, or a launcher, may create the job.)
    box: list[Any] = [None]
    if rank == 0:
        job = api(
            "POST",
            "/jobs",
            json={
                "name": "online profiling example",
                "stages": STAGES,
                "microbatches": MICROBATCHES,
                "schedule": {"name": "custom", "orders": torch_pipelining.export_orders(schedule)},
                "gpu_model": "A100 SXM (simulated)",
                "blocking_power": BLOCKING_POWER,  # watts while waiting: sets the frontier's costs
            },
        )
        box[0] = job["id"]
        say(f"created job {job['id']} (state {job['state']}, {job['world_size']} ranks)")
    dist.broadcast_object_list(box, src=0)
    job_id = str(box[0])

    # Step 3: the rank's client. On a real GPU leave `gpu` out: NvmlGpu($LOCAL_RANK), or the node
    # daemon when one runs. Here a simulated A100 that follows the profile's stage `rank`.
    gpu = SimulatedGpu.from_profile_csv(
        PROFILE, stage=rank, blocking_power=BLOCKING_POWER, time_scale=TIME_SCALE
    )
    client = PerseusClient(
        args.grpc,
        job=job_id,
        gpu=gpu,
        rank=RankPosition(global_rank=rank, pipeline_rank=rank),
        connection=Connection(tls_ca=args.tls_ca),
    )
    x = torch.randn(2 * MICROBATCHES, WIDTH, generator=torch.Generator().manual_seed(0))
    y = torch.randn(2 * MICROBATCHES, WIDTH, generator=torch.Generator().manual_seed(1))

    def train_step() -> None:
        optimizer.zero_grad()
        if rank == 0:
            schedule.step(x)  # the first stage feeds the inputs
        else:
            schedule.step(target=y)  # the last stage computes the loss
        optimizer.step()

    def agree(value: Any) -> Any:
        """Rank 0's ``value`` on every rank (all ranks must run the same number of steps)."""
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    with torch_pipelining.instrument(schedule, client):  # each schedule.step: one iteration
        # Step 4: once every rank has registered, rank 0 starts the scan. Registration runs in
        # the client's background thread, so training could start right away; the scan needs
        # every rank's supported clocks (it scans the clocks all of them support).
        if rank == 0:
            deadline = time.monotonic() + 60
            while api("GET", f"/jobs/{job_id}/status")["registered_ranks"] < world:
                if time.monotonic() > deadline:
                    raise TimeoutError("the ranks did not register within 60 s")
                time.sleep(0.05)
            body: dict[str, Any] = {}  # the defaults: every common clock, see the docs
            if args.short:
                clocks = list(gpu.supported_clocks())  # MHz, highest first
                body = {
                    "frequencies": clocks[::12],  # 4 clocks, 1410 .. 870 MHz
                    "warmup_iterations": 1,
                    "iterations_per_frequency": 2,
                }
            scan = api("POST", f"/jobs/{job_id}/profiling", json=body)
            say(f"profiling {len(scan['frequencies'])} clocks from {scan['current_frequency']} MHz")
        dist.barrier()

        # Keep training. Nothing in the loop knows about profiling: the plan the client gets
        # locks the clock and the client reports the measurements.
        steps, plan_version, last = 0, 0, ""
        while not plan_version:
            train_step()
            steps += 1
            decision = 0
            if rank == 0:
                prog = api("GET", f"/jobs/{job_id}/profiling")
                now = prog["status"]
                if prog["current_frequency"] is not None:
                    now += f" at {prog['current_frequency']} MHz"
                if now != last:
                    say(f"step {steps}: profiling {now}")
                    last = now
                if prog["status"] in ("failed", "aborted"):
                    raise RuntimeError(f"online profiling {prog['status']}: {prog['error']}")
                if prog["status"] == "done":  # step 5: solved, and the plan deployed with it
                    decision = api("GET", f"/jobs/{job_id}/status")["plan"]["version"]
            plan_version = agree(decision)
            if steps > args.max_steps:
                raise RuntimeError(f"online profiling not done after {steps} steps")

        # The new plan swaps in at the next iteration boundary once it reached this rank.
        deadline = time.monotonic() + 30
        while (client.latest_plan is None or client.latest_plan.version < plan_version) and (
            time.monotonic() < deadline
        ):
            time.sleep(0.01)
        for _ in range(args.train_steps):
            train_step()
        plan = client.plan
        assert plan is not None and plan.version >= plan_version and plan.profiling is None
        clocks_used = sorted({s.frequency_mhz for s in plan.steps}, reverse=True)
        say(
            f"trained {args.train_steps} steps on plan version {plan.version} "
            f"(clocks {clocks_used} MHz; {plan.reason})"
        )
        dist.barrier()
        if rank == 0:  # step 6, while the ranks are still connected
            summary = report(api, job_id, steps)
            if args.summary is not None:
                Path(args.summary).write_text(json.dumps(summary, indent=1))
        dist.barrier()
    client.close()  # resets the clocks (also on exceptions and SIGTERM)
    dist.destroy_process_group()
    return 0


# --- step 6: reading the result ------------------------------------------------------------------


def report(api: Rest, job_id: str, profiling_steps: int) -> dict[str, Any]:
    """Print what the server measured, solved and deployed; return it as a dict."""
    prog = api("GET", f"/jobs/{job_id}/profiling")
    rows = list(csv.DictReader(io.StringIO(api("GET", f"/jobs/{job_id}/profile"))))
    # The measured profile holds the computation's rows and the P2P transfers the hooks timed
    # (``transfer_forward`` / ``transfer_backward`` rows, one per boundary, per clock scanned).
    measured = [r for r in rows if r["instruction"] in ("forward", "backward")]
    transfers = [r for r in rows if r["instruction"].startswith("transfer_")]
    frontier = api("GET", f"/jobs/{job_id}/frontier", params={"points": "false"})
    status = api("GET", f"/jobs/{job_id}/status")

    print(f"\njob {job_id}: {status['state']}, online profiling {prog['status']}")
    print("energy per iteration at each scanned clock (both ranks, waiting included):")
    for e in prog["energy_per_iteration"]:
        print(f"  {e['frequency']:5d} MHz  {e['energy']:8.1f} J")

    # The measured profile against the simulated GPUs' model: with a safe time scale the times
    # match; a time scale too small for the real work would show here as times above the model.
    truth = {
        (int(r["stage"]), r["instruction"], int(r["frequency"])): (
            float(r["time"]),
            float(r["energy"]),
        )
        for r in csv.DictReader(PROFILE.open())
        if int(r["stage"]) < STAGES
    }
    worst_time = worst_energy = 0.0
    for r in measured:
        t, e = truth[(int(r["stage"]), r["instruction"], int(r["frequency"]))]
        worst_time = max(worst_time, abs(float(r["time"]) / t - 1))
        worst_energy = max(worst_energy, abs(float(r["energy"]) / e - 1))
    clocks = sorted({int(r["frequency"]) for r in measured}, reverse=True)
    print(
        f"measured profile: {len(measured)} rows at {clocks} MHz; largest deviation from the "
        f"model: time {100 * worst_time:.2f} %, energy {100 * worst_energy:.2f} %"
    )
    if transfers:
        slowest = max(float(r["time"]) for r in transfers)
        print(
            f"measured transfers: {len(transfers)} rows "
            f"({sorted({r['instruction'] for r in transfers})}), the slowest "
            f"{1000 * slowest:.2f} ms per microbatch"
        )
    plan = status["plan"]
    point = plan["pipelines"][0]
    t0, e0 = frontier["max_frequency_time"], frontier["max_frequency_energy"]
    print(
        f"frontier: {frontier['num_points']} plans, solved in {frontier['solve_seconds']:.2f} s; "
        f"T0 {t0:.4f} s, E0 {e0:.1f} J at max clocks"
    )
    print(
        f"deployed: plan version {plan['version']} ({plan['kind']}): point {point['index']}, "
        f"{point['time']:.4f} s, {point['energy']:.1f} J per iteration "
        f"({100 * (1 - point['energy'] / e0):.1f} % less energy than max clocks)"
    )
    recent = status["pipelines"][0]["recent_iterations"]
    if recent:
        print(
            f"status: {status['connected_ranks']}/{status['expected_ranks']} ranks connected; "
            f"last iteration {recent[-1]['time']:.4f} s; overhead {status['iteration_overhead']:.3f}"
        )
    return {
        "job": job_id,
        "state": status["state"],
        "profiling": prog,
        "profiling_steps": profiling_steps,
        "measured_rows": len(measured),
        "measured_transfer_rows": len(transfers),
        "measured_clocks": clocks,
        "worst_time_deviation": worst_time,
        "worst_energy_deviation": worst_energy,
        "frontier": frontier,
        "plan": plan,
        "ranks": status["ranks"],
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--short", action="store_true", help="4 clocks, 1 warm-up + 2 measured each")
    ap.add_argument("--server", help="REST URL of a running perseus serve (default: start one)")
    ap.add_argument("--grpc", help="its gRPC host:port (default: the REST host, port 50051)")
    ap.add_argument(
        "--tls-ca",
        help="PEM file of the CA that signed the server's certificate, for REST and gRPC "
        "(default $PERSEUS_TLS_CA; with one, gRPC uses TLS)",
    )
    ap.add_argument("--train-steps", type=int, default=5, help="steps on the deployed plan")
    ap.add_argument("--max-steps", type=int, default=2000, help="give up profiling after these")
    ap.add_argument("--timeout", type=float, default=900, help="seconds the launcher waits")
    ap.add_argument("--summary", help="also write the result as JSON to this file")
    args = ap.parse_args(argv)
    if args.server is not None and args.grpc is None:
        from urllib.parse import urlsplit

        args.grpc = f"{urlsplit(args.server).hostname}:50051"
    if "RANK" not in os.environ:
        return launch(args, argv)
    if args.server is None:
        raise SystemExit("under torchrun, give --server (and --grpc)")
    return rank_main(args)


if __name__ == "__main__":
    sys.exit(main())
