"""PNG drawings of a frontier (matplotlib's Agg backend; no pyplot global state)."""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["frontier_png"]


def frontier_png(
    doc: Mapping[str, Any],
    *,
    marked: Sequence[tuple[int, str]] = (),
    title: str = "",
) -> bytes:
    """Energy vs iteration time of a frontier JSON document (``Frontier.to_json()``).

    Also drawn: the lower bound, the all-max-frequency point (T0, E0) and ``marked`` points
    ``(index, label)``.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    pts = doc["points"]
    t = [p["time"] for p in pts]
    e = [p["energy"] for p in pts]
    lb = [p["lower_bound"] for p in pts]
    t0, e0 = doc["max_frequency_time"], doc["max_frequency_energy"]
    fig = Figure(figsize=(7.5, 4.8), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.plot(t, e, "-", lw=1.6, color="tab:blue", label="frontier (measured T, E)")
    ax.plot(t, lb, ":", lw=1.2, color="tab:gray", label="lower bound (convex relaxation)")
    ax.plot([t0], [e0], "kx", ms=8, mew=2, label=f"all max clocks (T0={t0:.4g} s, E0={e0:.5g} J)")
    ax.axvline(t0, color="k", lw=0.6, alpha=0.4)
    for i, label in marked:
        ax.plot([t[i]], [e[i]], "o", ms=7, label=label)
    ax.set_xlabel("iteration time (s)")
    ax.set_ylabel("energy per iteration (J)")
    sched = doc.get("schedule", "")
    ax.set_title(
        title
        or f"Perseus frontier: {sched}, {doc.get('stages')} stages x {doc.get('microbatches')} microbatches"
    )
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()
