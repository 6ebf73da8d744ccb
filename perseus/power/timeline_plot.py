"""The power-timeline plot and the ``perseus frontier`` outputs of the swing options.

``perseus frontier ... --power-timeline FILE.png [--max-swing F --max-ramp F]``: the job's power
against time over two iterations of the selected plan (the policy's, else the fastest); with
bounds, the plan and floors chosen together (:func:`perseus.power.plan_for_swing`) drawn over the
plan alone, the floors shaded, the bound drawn, and what they cost in the title.
"""

from __future__ import annotations

import io
from typing import Any

from perseus.power.floors import SwingBounds
from perseus.power.swing import SwingPlan, deadline_for, plan_for_swing
from perseus.power_timeline import PowerTimeline, plan_timeline
from perseus.problem import EnergyProblem

__all__ = ["swing_outputs", "timeline_png"]


def timeline_png(
    before: PowerTimeline,
    after: PowerTimeline | None = None,
    bounds: SwingBounds | None = None,
    *,
    under: PowerTimeline | None = None,
    title: str = "",
) -> bytes:
    """Power against time over two iterations: the plan, and with its floors when given.

    ``under``: what the floors are drawn over (the plan ``after`` runs, without its floors;
    default ``before``).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 4.6), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    tb, wb = before.samples(2)
    w = bounds.window if bounds is not None else 0.1
    ax.step(
        tb,
        wb,
        where="post",
        lw=1.2,
        color="tab:gray",
        label=(
            f"plan alone: swing {before.swing:.2f}, largest {w:g} s change "
            f"{100 * before.max_change(w) / before.peak:.0f} % of peak"
        ),
    )
    if after is not None:
        ta, wa = after.samples(2)
        ax.step(
            ta,
            wa,
            where="post",
            lw=1.6,
            color="tab:blue",
            label=(
                f"with floors: swing {after.swing:.2f}, largest {w:g} s change "
                f"{100 * after.max_change(w) / after.peak:.0f} % of peak"
            ),
        )
        base = (under or before).at(ta)
        ax.fill_between(ta, base, wa, step="post", color="tab:blue", alpha=0.18, label="floors")
    if bounds is not None and bounds.max_swing is not None:
        peak = (after or before).peak
        low = (1 - bounds.max_swing) * peak
        ax.axhline(
            low,
            color="tab:red",
            ls="--",
            lw=1.1,
            label=f"bound: trough >= {100 * (1 - bounds.max_swing):.0f} % of peak",
        )
        ax.axhline(peak, color="k", lw=0.6, alpha=0.5)
    ax.axvline(before.period, color="k", lw=0.6, alpha=0.4)
    ax.set_xlabel("time (s), two iterations")
    ax.set_ylabel("job power (W)")
    ax.set_ylim(0, 1.08 * max(before.peak, (after or before).peak))
    ax.set_title(title or "Power timeline")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="lower center")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def swing_outputs(
    frontier: Any,
    problem: EnergyProblem,
    selected: dict[str, Any] | None,
    bounds: SwingBounds | None,
    png: str | None,
) -> tuple[dict[str, Any], str]:
    """The JSON entries (``power_timeline``, ``swing``) and a line for stderr; writes ``png``."""
    index = 0 if selected is None else int(selected["point"])
    before = plan_timeline(problem, frontier.plans[index])
    out: dict[str, Any] = {"power_timeline": before.to_json()}
    line = (
        f"perseus: point {index}'s power: peak {before.peak:.0f} W, trough "
        f"{before.trough:.0f} W, swing {before.swing:.3f}, largest 100 ms change "
        f"{before.max_change():.0f} W"
    )
    sp: SwingPlan | None = None
    if bounds is not None:
        kind, value = ("index", 0.0) if selected is None else _policy_of(selected)
        sp = plan_for_swing(frontier, problem, bounds, deadline_for(frontier, index, kind, value))
        windows = sorted({0.1, bounds.window})
        out["swing"] = {**sp.to_json(), "power_timeline": sp.timeline.to_json(windows=windows)}
        extra = sp.energy - before.energy
        line += (
            f"\nperseus: with max_swing={bounds.max_swing}, max_ramp={bounds.max_ramp}: "
            f"plan {sp.plan_energy:.1f} J + floors {sp.floor_energy:.1f} J = "
            f"{sp.energy:.1f} J ({100 * extra / before.energy:+.2f} % against the point "
            f"alone), swing {sp.timeline.swing:.3f}, T = {sp.time:.4f} s"
        )
    if png:
        title = f"point {index}: {frontier.schedule.name}, {frontier.schedule.ranks} x {frontier.schedule.microbatches}"
        if sp is not None:
            title += f"; floors cost {sp.energy - before.energy:.0f} J per iteration ({100 * (sp.energy / before.energy - 1):+.1f} %)"
        with open(png, "wb") as fh:
            fh.write(
                timeline_png(
                    before,
                    sp.timeline if sp else None,
                    bounds,
                    under=sp.before if sp else None,
                    title=title,
                )
            )
    return out, line


def _policy_of(selected: dict[str, Any]) -> tuple[str, float]:
    """The policy's kind and value in a ``selected`` entry of the CLI's JSON."""
    for kind in ("deadline", "slowdown"):
        if kind in selected:
            return kind, float(selected[kind])
    return "index", 0.0
