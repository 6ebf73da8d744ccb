"""The demo's orchestration: a real server, one job, the rank processes, the results.

:func:`run` starts ``perseus serve`` on a temporary database (:class:`perseus_server.ServerProcess`),
starts every rank as a process ``python -m perseus_demo.rank`` (they import torch and form their
process groups meanwhile: the longest part of a run's start), registers a job through the REST
API, uploads the profile and computes the frontier, works out phase 5's power budget
(``--power-fraction`` of the max-clock average power, checked against the server: ``GET
/jobs/{id}/plan?power_budget=W``), then hands the ranks the job (``ranks/job.json``): they start
phase 1 only then, and connect to the server's gRPC endpoint through the client after it, like a
training job's ranks would. When the ranks are done it reads their step records, asks
:func:`~perseus_demo.analysis.analyse` for the tables and checks, draws ``demo.png`` and writes
``results.json``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from perseus_demo.analysis import analyse, uniform_power_limit_phase
from perseus_demo.errors import DemoError
from perseus_demo.options import DemoOptions, check_options
from perseus_demo.phases import JOB_FILE, PHASES
from perseus_demo.profile import blocking_power_for, profile_path, slice_profile

__all__ = ["RANK_MODULE", "run", "run_ranks", "write_json"]

#: The module every rank process runs (``python -m RANK_MODULE --config CFG``).
RANK_MODULE = "perseus_demo.rank"


def write_json(path: Path, doc: Any) -> None:
    """Write ``doc`` to ``path`` whole or not at all (a reader polling for it never sees half)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)


class _Api:
    """The server's REST API, as any user would call it (httpx)."""

    def __init__(self, base: str) -> None:
        import httpx

        self.http = httpx.Client(base_url=base, timeout=60.0)

    def __call__(self, method: str, path: str, **kw: Any) -> Any:
        r = self.http.request(method, path, **kw)
        if r.status_code >= 400:
            raise DemoError(f"{method} {path}: {r.status_code} {r.text}")
        return r.json() if r.content and "json" in r.headers.get("content-type", "") else r.text

    def close(self) -> None:
        self.http.close()


def _setup_job(api: _Api, opts: DemoOptions, csv_text: str, power: float) -> dict[str, Any]:
    """Register the job, upload its profile, compute its frontier; the job and its first plan."""
    job = api(
        "POST",
        "/jobs",
        json={
            "name": "perseus demo",
            "stages": opts.stages,
            "microbatches": opts.microbatches,
            "schedule": "1f1b",
            "data_parallel": opts.pipelines,
            "gpu_model": "A100 SXM (simulated)",
            "blocking_power": power,
        },
    )["id"]
    api(
        "PUT",
        f"/jobs/{job}/profile",
        content=csv_text.encode(),
        headers={"Content-Type": "text/csv"},
    )
    t = time.perf_counter()
    api("POST", f"/jobs/{job}/frontier")
    while True:
        st = api("GET", f"/jobs/{job}/frontier", params={"points": False})
        if st["status"] == "done":
            break
        if st["status"] == "failed":
            raise DemoError(f"the frontier computation failed: {st['error']}")
        time.sleep(0.1)
    solve_wall = time.perf_counter() - t
    frontier = api("GET", f"/jobs/{job}/frontier")
    status = api("GET", f"/jobs/{job}/status")
    return {
        "job": job,
        "frontier": frontier,
        "solve_seconds": frontier.get("solve_seconds"),
        "solve_wall_seconds": solve_wall,
        "plan_version": status["plan"]["version"],
        "default_index": status["plan"]["pipelines"][0]["index"],
    }


def _power_budget(api: _Api, opts: DemoOptions, job: dict[str, Any]) -> dict[str, Any]:
    """Phase 5's budget, and the plan the server picks under it.

    The budget is ``--power-fraction`` of the job's max-clock average power (W, whole job). A
    budget no plan meets is a :class:`DemoError` naming the lowest power the job can reach.
    """
    fr = job["frontier"]
    max_power = opts.pipelines * fr["max_frequency_energy"] / fr["max_frequency_time"]
    watts = opts.power_fraction * max_power
    r = api.http.get(f"/jobs/{job['job']}/plan", params={"power_budget": watts})
    if r.status_code == 422 and "lowest_power" in r.json():
        low = float(r.json()["lowest_power"])
        raise DemoError(
            f"--power-fraction: {opts.power_fraction:g} x {max_power:.0f} W = {watts:.0f} W is "
            f"below the lowest power of any plan, {low:.0f} W ({low / max_power:.3f} of max clocks)"
        )
    if r.status_code >= 400:
        raise DemoError(f"GET /jobs/{job['job']}/plan?power_budget: {r.status_code} {r.text}")
    plan = r.json()
    return {
        "fraction": opts.power_fraction,
        "max_clock_power": max_power,
        "watts": watts,
        "plan": {k: plan[k] for k in ("index", "time", "energy", "average_power", "peak_power")},
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_ranks(
    cfg: dict[str, Any],
    world: int,
    rank_dir: Path,
    timeout: float,
    module: str = RANK_MODULE,
    job: Callable[[], dict[str, Any]] | None = None,
) -> None:
    """Run ``world`` rank processes of ``module`` on ``cfg`` until all exit 0.

    ``module`` defaults to :data:`RANK_MODULE`; ``cfg`` is written to ``rank_dir/config.json``;
    each rank logs to ``rank_dir/rank<g>.log``. ``job``, if given, is called once the ranks are
    started (they start up meanwhile), and what it returns is written to ``rank_dir/`` +
    :data:`JOB_FILE` for them; ``timeout`` counts from then.

    Raises :class:`DemoError` with the log's tail when a rank fails, or when they are not done
    within ``timeout`` seconds; every rank still running is killed on the way out (also when
    ``job`` raises).
    """
    cfg_path = rank_dir / "config.json"
    cfg_path.write_text(json.dumps(cfg))
    env = dict(os.environ)
    env.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(_free_port()),
        WORLD_SIZE=str(world),
        OMP_NUM_THREADS="1",
        CUDA_VISIBLE_DEVICES="",
        PYTHONWARNINGS="ignore",
        PYTHONUNBUFFERED="1",
    )
    procs: list[tuple[subprocess.Popen[bytes], Path]] = []
    try:
        for r in range(world):
            log = rank_dir / f"rank{r}.log"
            with open(log, "wb") as fh:
                p = subprocess.Popen(
                    [sys.executable, "-m", module, "--config", str(cfg_path)],
                    env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                    stdout=fh,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                )
            procs.append((p, log))
        if job is not None:
            write_json(rank_dir / JOB_FILE, job())
        deadline = time.monotonic() + timeout
        while True:
            codes = [p.poll() for p, _ in procs]
            failed = [i for i, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                i = failed[0]
                tail = procs[i][1].read_text(errors="replace")[-3000:]
                raise DemoError(f"rank {i} exited with status {codes[i]}:\n{tail}")
            if all(c == 0 for c in codes):
                return
            if time.monotonic() > deadline:
                raise DemoError(f"the ranks did not finish within {timeout:.0f} s")
            time.sleep(0.2)
    finally:
        for p, _ in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def _prepare_output(out: Path, csv_text: str) -> Path:
    """The output folder with the run's profile and an empty ``ranks`` folder, which it returns."""
    out.mkdir(parents=True, exist_ok=True)
    rank_dir = out / "ranks"
    rank_dir.mkdir(exist_ok=True)
    for old in [*rank_dir.glob("rank*.json"), rank_dir / JOB_FILE]:
        old.unlink(missing_ok=True)
    (out / "profile.csv").write_text(csv_text)
    return rank_dir


def _rank_config(opts: DemoOptions, power: float, srv: Any, rank_dir: Path) -> dict[str, Any]:
    """The config every rank process reads at its start (:mod:`perseus_demo.rank`).

    The job's part comes later (:func:`_job_config`, in :data:`JOB_FILE`).
    """
    return {
        "stages": opts.stages,
        "pipelines": opts.pipelines,
        "microbatches": opts.microbatches,
        "iterations": opts.iterations,
        "straggler": opts.straggler,
        "straggler_pipeline": 1,
        "time_scale": opts.time_scale,
        "blocking_power": power,
        "profile_csv": str((rank_dir.parent / "profile.csv").resolve()),
        "grpc_target": srv.grpc_target,
        "http_url": srv.http_url,
        "out_dir": str(rank_dir.resolve()),
        "job_timeout": opts.timeout,
    }


def _job_config(job: dict[str, Any], budget_watts: float) -> dict[str, Any]:
    """The job's part of the ranks' config, handed to them when it is ready (:data:`JOB_FILE`)."""
    return {"job": job["job"], "plan_version": job["plan_version"], "power_budget": budget_watts}


def _draw(
    png: Path,
    res: dict[str, Any],
    fr: dict[str, Any],
    ranks: list[dict[str, Any]],
    opts: DemoOptions,
    log: Callable[[str], None],
) -> str | None:
    """The demo's figure at ``png`` (its path), or None (logged) where it could not be drawn."""
    try:
        from perseus_demo.plotting import demo_png

        demo_png(png, res, fr, ranks, stages=opts.stages)
        return str(png.resolve())
    except Exception as e:  # noqa: BLE001 - a plotting problem must not hide the results
        log(f"perseus demo: could not draw {png}: {e}")
        return None


def _swing(api: _Api, job: str, log: Callable[[str], None]) -> dict[str, Any] | None:
    """The server's swing-bounded plan at T0 (see :mod:`perseus_demo.swing`); None, logged, if not."""
    from perseus_demo.swing import ask_swing, swing_lines

    try:
        swing = ask_swing(api, job)
        for line in swing_lines(swing):
            log("perseus demo: " + line.strip())
        return swing
    except Exception as e:  # noqa: BLE001 - the swing section must not stop the demo
        log(f"perseus demo: could not ask for a swing-bounded plan: {e}")
        return None


def _draw_swing(
    png: Path, swing: dict[str, Any], csv_text: str, opts: DemoOptions, power: float,
    log: Callable[[str], None],
) -> str | None:  # fmt: skip
    """``swing.png`` (its path), or None (logged) where it could not be drawn."""
    try:
        from perseus_demo.swing import swing_png

        swing_png(png, swing, csv_text, opts.microbatches, power, opts.pipelines)
        return str(png.resolve())
    except Exception as e:  # noqa: BLE001 - a plotting problem must not hide the results
        log(f"perseus demo: could not draw {png}: {e}")
        return None


def _prepare_job(
    api: _Api, opts: DemoOptions, csv_text: str, power: float, log: Callable[[str], None]
) -> dict[str, Any]:
    """The job on the server, phase 5's budget and the swing answer (``job``, ``budget``, ``swing``)."""
    job = _setup_job(api, opts, csv_text, power)
    fr = job["frontier"]
    log(
        f"perseus demo: job {job['job']}: {opts.stages} stages x {opts.microbatches} "
        f"microbatches (1F1B), {opts.pipelines} pipelines; frontier of {len(fr['points'])} plans "
        f"in {job['solve_seconds']:.2f} s; T0 = {fr['max_frequency_time']:.4f} s; "
        f"deployed point {job['default_index']} (plan version {job['plan_version']})"
    )
    budget = _power_budget(api, opts, job)
    swing = _swing(api, job["job"], log)
    log(
        f"perseus demo: phase 5 budget {budget['watts']:.0f} W "
        f"({100 * opts.power_fraction:.0f} % of the max-clock {budget['max_clock_power']:.0f} W): "
        f"the server's plan is point {budget['plan']['index']} "
        f"({budget['plan']['average_power']:.0f} W)"
    )
    return {"job": job, "budget": budget, "swing": swing}


def run(opts: DemoOptions, log: Callable[[str], None]) -> dict[str, Any]:
    """Run the demo; its results (what ``results.json`` holds). ``log`` gets progress lines."""
    with profile_path(opts.profile) as path:
        power = blocking_power_for(path.name, opts.blocking_power)
        from perseus.errors import ProfileError

        try:
            csv_text, profile_stages = slice_profile(path, opts.stages)
        except ProfileError as e:
            raise DemoError(f"--profile: {e}") from None
    check_options(opts, profile_stages)
    from perseus_server import ServerProcess

    out = opts.output
    rank_dir = _prepare_output(out, csv_text)
    world = opts.world
    t_start = time.perf_counter()
    with (
        tempfile.TemporaryDirectory(prefix="perseus-demo-") as tmp,
        ServerProcess(Path(tmp) / "perseus.db", log_path=out / "server.log") as srv,
    ):
        log(f"perseus demo: server at {srv.http_url} (REST) and {srv.grpc_target} (gRPC)")
        api = _Api(srv.http_url)
        try:
            log(
                f"perseus demo: launching {world} ranks (torch.distributed.pipelining over gloo, "
                f"simulated GPUs at time scale {opts.time_scale}); {len(PHASES)} phases of "
                f"{opts.iterations} steps, from when the job is ready"
            )
            setup: dict[str, Any] = {}

            def job_ready() -> dict[str, Any]:  # while the ranks start up
                setup.update(_prepare_job(api, opts, csv_text, power, log))
                return _job_config(setup["job"], setup["budget"]["watts"])

            cfg = _rank_config(opts, power, srv, rank_dir)
            t_ranks = time.perf_counter()
            run_ranks(cfg, world, rank_dir, opts.timeout, job=job_ready)
            rank_seconds = time.perf_counter() - t_ranks
            job, budget, swing = setup["job"], setup["budget"], setup["swing"]
            fr = job["frontier"]
            status = api("GET", f"/jobs/{job['job']}/status")
            metrics = api("GET", "/metrics")
        finally:
            api.close()
    ranks = [json.loads((rank_dir / f"rank{r}.json").read_text()) for r in range(world)]
    budget["uniform"] = uniform_power_limit_phase(
        csv_text,
        stages=opts.stages,
        microbatches=opts.microbatches,
        pipelines=opts.pipelines,
        blocking_power=power,
        watts=budget["watts"],
    )
    budget["server_measured"] = status.get("measured")
    budget["constraint"] = (status.get("plan") or {}).get("constraint")
    res = analyse(
        ranks,
        fr,
        stages=opts.stages,
        pipelines=opts.pipelines,
        blocking_power=power,
        straggler=opts.straggler,
        default_index=job["default_index"],
        power_budget=budget,
    )
    replan_metrics = [
        line for line in str(metrics).splitlines() if line.startswith("perseus_replans_total")
    ]
    res.update(
        job=job["job"],
        config={k: v for k, v in cfg.items() if k not in ("grpc_target", "http_url", "out_dir")},
        frontier={
            "points": len(fr["points"]),
            "max_frequency_time": fr["max_frequency_time"],
            "max_frequency_energy": fr["max_frequency_energy"],
            "default_index": job["default_index"],
            "default_time": fr["points"][job["default_index"]]["time"],
            "default_energy": fr["points"][job["default_index"]]["energy"],
            "solve_seconds": job["solve_seconds"],
        },
        replans=status["recent_replans"],
        replan_metrics=replan_metrics,
        final_plan=status["plan"],
        wall_seconds={"ranks": rank_seconds, "total": time.perf_counter() - t_start},
        output=str(out.resolve()),
    )
    res["png"] = _draw(out / "demo.png", res, fr, ranks, opts, log)
    if swing is not None:
        res["swing"] = swing
        res["swing_png"] = _draw_swing(out / "swing.png", swing, csv_text, opts, power, log)
    (out / "results.json").write_text(json.dumps(res, indent=1))
    return res
