"""``demo.png``: the frontier with the plans each phase ran, and a per-rank timeline.

The timeline is of one step of phases 2 and 3, coloured by clock (matplotlib's Agg backend; no
pyplot global state).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["demo_png"]


def demo_png(
    path: Path,
    res: dict[str, Any],
    frontier: dict[str, Any],
    ranks: list[dict[str, Any]],
    *,
    stages: int,
) -> None:
    """Draw the run's results ``res``, its ``frontier`` and the ``ranks``' timelines to ``path``.

    ``res`` is from :func:`~perseus_demo.analysis.analyse`; ``frontier`` is the server's
    frontier document.
    """
    import matplotlib
    from matplotlib import cm, colors
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    pts = frontier["points"]
    fig = Figure(figsize=(13, 9), dpi=100)
    FigureCanvasAgg(fig)
    gs = fig.add_gridspec(2, 2, height_ratios=[1, 1])
    ax = fig.add_subplot(gs[0, :])
    ax.plot(
        [p["time"] for p in pts],
        [p["energy"] for p in pts],
        "-",
        color="tab:blue",
        lw=1.6,
        label="frontier (energy per pipeline iteration)",
    )
    ax.plot(
        [p["time"] for p in pts],
        [p["lower_bound"] for p in pts],
        ":",
        color="tab:gray",
        label="lower bound",
    )
    t0, e0 = frontier["max_frequency_time"], frontier["max_frequency_energy"]
    ax.plot([t0], [e0], "kx", ms=9, mew=2, label=f"all max clocks (T0={t0:.3f} s)")
    marks: dict[int, list[str]] = {}
    for ph in res["phases"]:
        for r in ph["pipelines"]:
            if r["plan_in_window"] is not None:
                marks.setdefault(r["plan_in_window"], []).append(f"{ph['phase']} p{r['pipeline']}")
    for i, labels in sorted(marks.items()):
        ax.plot(
            [pts[i]["time"]],
            [pts[i]["energy"]],
            "o",
            ms=8,
            label=f"point {i}: " + ", ".join(dict.fromkeys(labels)),
        )
    ax.set_xlabel("iteration time (s)")
    ax.set_ylabel("energy per iteration (J)")
    ax.set_title("Perseus demo: frontier and the plans each phase ran")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)

    freqs = [s[3] for r in ranks for tl in r["timelines"].values() for s in tl["spans"]]
    norm = colors.Normalize(vmin=min(freqs), vmax=max(freqs))
    cmap = matplotlib.colormaps["viridis"]
    for col, phase in enumerate(("perseus", "straggler")):
        tax = fig.add_subplot(gs[1, col])
        spans = [(r, s) for r in ranks for s in r["timelines"].get(phase, {}).get("spans", [])]
        if not spans:
            continue
        origin = min(s[4] for _, s in spans)
        scale = ranks[0]["time_scale"]
        for r, s in spans:
            y = r["pipeline"] * (stages + 1) + r["stage"]
            x0 = (s[4] - origin) / scale
            w = (s[5] - s[4]) / scale
            tax.broken_barh(
                [(x0, w)],
                (y - 0.4, 0.8),
                facecolors=cmap(norm(s[3])),
                edgecolor="white" if s[0] == "forward" else "black",
                linewidth=0.4,
            )
        ticks = [
            p * (stages + 1) + s
            for p in sorted({r["pipeline"] for r in ranks})
            for s in range(stages)
        ]
        tax.set_yticks(ticks)
        tax.set_yticklabels([f"p{t // (stages + 1)} s{t % (stages + 1)}" for t in ticks])
        tax.invert_yaxis()
        tax.set_xlabel("time in the step (s, simulated)")
        tax.set_title(f"one step of phase '{phase}' (black edge: backward)")
        sm = cm.ScalarMappable(norm=norm, cmap=cmap)
        fig.colorbar(sm, ax=tax, label="SM clock (MHz)")
    fig.tight_layout()
    fig.savefig(path, format="png")
