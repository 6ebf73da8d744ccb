"""The demo's text report: a table per phase, the server's replanning log, the checks."""

from __future__ import annotations

from typing import Any

from perseus_demo.phases import PHASE_TITLES

__all__ = ["phase5_lines", "phase_tables", "report"]


def phase_tables(res: dict[str, Any]) -> str:
    """One table per phase of :func:`~perseus_demo.analysis.analyse`'s results."""
    lines = []
    for ph in res["phases"]:
        lines.append(
            f"{PHASE_TITLES[ph['phase']]}  (steady steps {ph['window'][0]}-{ph['window'][1]}; "
            f"step {ph['step_time']:.4f} s, job {ph['energy']:.1f} J/step, saving {100 * ph['saving']:.1f} %)"
        )
        lines.append(
            "  pipeline  iteration(s)  step(s)   energy(J)  max-clock(J)  saving   plan(s)  reason"
        )
        for r in ph["pipelines"]:
            plans = ",".join(str(i) for i in r["plans"]) or "-"
            lines.append(
                f"  {r['pipeline']:>8}  {r['iteration_time']:>12.4f}  {r['step_time']:>7.4f}  "
                f"{r['energy']:>10.1f}  {r['baseline_energy']:>12.1f}  {100 * r['saving']:>5.1f} %  "
                f"{plans:>7}  {r['reason'][:70]}"
            )
        lines.append("")
    return "\n".join(lines)


def _opt(x: float | None, fmt: str, scale: float = 1.0) -> str:
    return "-" if x is None else format(scale * x, fmt)


def _phase5_time_line(p: dict[str, Any]) -> str:
    """What phase 5's "vs max clocks" figures are against."""
    ref = p.get("time_reference", "phase 1")
    line = f"  vs max clocks: step time {100 * (p['time_ratio'] - 1):+.2f} % against {ref}"
    if ref != "phase 1" and "time_ratio_phase1" in p:
        line += f" ({100 * (p['time_ratio_phase1'] - 1):+.2f} % against phase 1)"
    return line + ", energy against phase 1."


def phase5_lines(p: dict[str, Any]) -> list[str]:
    """Phase 5 against a uniform per-GPU power limit with the same average power."""
    server = p["server_measured_power"]
    lines = [
        f"Phase 5: power budget {p['budget_watts']:.0f} W ({100 * p['fraction']:.0f} % of the "
        f"max-clock {p['max_clock_power']:.0f} W); the server deployed point {p['plan_index']} "
        f"({p['plan_power']:.0f} W predicted; {p['constraint']}).",
        "                    power(W)  step(s)  vs max clocks  energy(J/step)  vs max clocks",
        f"  Perseus (measured) {p['measured_power']:>8.0f}  {p['step_time']:>7.4f}  "
        f"{100 * (p['time_ratio'] - 1):>+12.2f} %  {p['energy']:>14.1f}  "
        f"{100 * (p['energy_ratio'] - 1):>+12.2f} %",
    ]
    if p["uniform_limit"] is None:
        lines.append("  uniform power limit: none meets the budget")
    else:
        lines.append(
            f"  uniform {p['uniform_limit']:.0f} W/GPU  {p['uniform_power']:>8.0f}  "
            f"{p['uniform_step_time']:>7.4f}  {100 * p['uniform_slowdown']:>+12.2f} %  "
            f"{p['uniform_energy']:>14.1f}  {100 * (p['uniform_energy_ratio'] - 1):>+12.2f} %"
            "   (predicted from the profile)"
        )
    lines.append(_phase5_time_line(p))
    lines.append(
        f"  server: measured {_opt(server, '.0f')} W (the ranks' reports, current plan), energy "
        f"saved {_opt(p['server_energy_saved'], '.0f')} J against max clocks so far."
    )
    return lines


def report(res: dict[str, Any]) -> str:
    """The report of a finished run: tables, replanning log, metrics, checks, wall time."""
    c = res["checks"]
    lines = [phase_tables(res), "Replanning decisions (server log, newest last):"]
    for r in res["replans"]:
        lines.append(f"  v{r['version']}: {r['why']}" + ("" if r["changed"] else " (no change)"))
    lines += ["Metrics: " + "; ".join(res["replan_metrics"]), ""]
    lines.append(
        f"Phase 2: step time {100 * (c['phase2_time_ratio'] - 1):+.2f} % vs max clocks "
        f"({c.get('phase2_time_reference', 'phase 1')}); saving "
        f"{100 * c['phase2_saving']:.2f} % measured vs {100 * c['phase2_predicted_saving']:.2f} % "
        "predicted by the frontier."
    )
    lines.append(
        f"Phase 3: healthy pipeline replanned after {c['phase3_replanned_after']} step(s); "
        f"T' = {c['phase3_t_prime']:.4f} s, healthy iteration time within "
        f"{100 * (c['phase3_healthy_time_ratio'] - 1):.2f} % of it; job {c['phase3_job_energy']:.1f} J "
        f"per step vs {c['phase3_max_clock_energy']:.1f} J at max clocks while waiting."
    )
    lines.append(f"Phase 4: back to the default plan after {c['phase4_restored_after']} step(s).")
    if "phase5" in c:
        lines += phase5_lines(c["phase5"])
    if res.get("swing"):
        from perseus_demo.swing import swing_lines

        lines += swing_lines(res["swing"]) + [f"  drawn in {res.get('swing_png')}."]
    if c["missed"]:
        lines.append("MISSED: " + "; ".join(c["missed"]) + ".")
    lines.append(
        f"Wall time {res['wall_seconds']['total']:.0f} s. Wrote {res.get('png')} and "
        f"{res['output']}/results.json."
    )
    return "\n".join(lines)
