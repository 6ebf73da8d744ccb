"""GPU check: does this GPU hold a power floor, and what does it draw while it does?

On a GPU machine (``pynvml`` and ``/dev/nvidiactl``): opens GPU 0 through the client's NVML
backend and says whether it can hold a floor (NVML power smoothing: Blackwell or newer, root),
reading only: its power limit and its idle power, sampled every 20 ms. It changes no setting of
the GPU unless told to with ``--apply`` (on a GPU you administer, never on a shared or lent one):
then, where it can, it idles the GPU at no floor, then at ``--fraction`` of its power limit, then
at none again. Prints one JSON object; elsewhere it says it skipped. ``--smoke`` runs the
``--apply`` steps on the simulated GPU (whose model holds floors), for the suite.

    python benchmarks/power_floor_gpu.py --seconds 2                  # read-only
    python benchmarks/power_floor_gpu.py --apply --fraction 0.5       # sets and releases a floor
    python benchmarks/power_floor_gpu.py --smoke
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

from perseus_client import SimulatedGpu
from perseus_client.gpu.base import GpuBackend


def _phase(gpu: GpuBackend, seconds: float) -> dict[str, Any]:
    """Mean sampled power and the energy counter's average power over ``seconds``."""
    e0, t0 = gpu.energy_mj(), gpu.timestamp()
    samples: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        p = gpu.power_w()
        if p is not None:
            samples.append(p)
        time.sleep(0.02)
    e1, t1 = gpu.energy_mj(), gpu.timestamp()
    return {
        "sampled_w": statistics.fmean(samples) if samples else None,
        "counter_w": (e1 - e0) / 1000 / (t1 - t0) if t1 > t0 else None,
    }


def check(gpu: GpuBackend, fraction: float, seconds: float, apply: bool) -> dict[str, Any]:
    """The check's steps on ``gpu``: read-only unless ``apply``."""
    why = gpu.floor_unavailable()
    out: dict[str, Any] = {"device": getattr(gpu, "name", "gpu"), "floor_unavailable": why}
    limit = gpu.max_power_limit_w()
    out["max_power_limit_w"] = limit
    if not apply:
        out["idle"] = _phase(gpu, seconds)
        out["applied"] = "no: read-only (--apply sets and releases a floor)"
        return out
    if why is not None or limit is None:
        return out
    watts = fraction * limit
    out["floor_w"] = watts
    out["before"] = _phase(gpu, seconds)
    out["held"] = gpu.set_power_floor(watts)
    out["during"] = _phase(gpu, seconds)
    gpu.set_power_floor(0.0)
    out["after"] = _phase(gpu, seconds)
    return out


def main() -> None:
    """Run the check on GPU 0 (or the simulated GPU with ``--smoke``) and print JSON."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fraction", type=float, default=0.5, help="floor, share of the power limit")
    ap.add_argument("--seconds", type=float, default=2.0, help="length of each phase")
    ap.add_argument("--smoke", action="store_true", help="the simulated GPU, short phases")
    ap.add_argument(
        "--apply",
        action="store_true",
        help="set and release a floor on GPU 0 (changes its power smoothing settings; only on a "
        "GPU you administer)",
    )
    a = ap.parse_args()
    if a.smoke:
        profile = {(0, "forward"): {1410: (0.02, 6.0)}}
        gpu: GpuBackend = SimulatedGpu(
            profile, blocking_power=80.0, time_scale=1.0, name="A100", max_power_limit_w=400.0
        )
        result = check(gpu, a.fraction, 0.2, apply=True)
    elif os.path.exists("/dev/nvidiactl"):
        from perseus_client import NvmlGpu

        gpu = NvmlGpu(0)
        try:
            result = check(gpu, a.fraction, a.seconds, apply=a.apply)
        finally:
            if a.apply:
                gpu.set_power_floor(0.0)
            gpu.close()
    else:
        result = {"skipped": "no NVIDIA GPU here (/dev/nvidiactl is missing)"}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
