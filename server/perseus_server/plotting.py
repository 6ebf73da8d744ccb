"""PNG drawing of a frontier (matplotlib's Agg backend, no pyplot global state)."""

from __future__ import annotations

import io

from perseus.frontier import Frontier

__all__ = ["frontier_png"]


def frontier_png(frontier: Frontier, deployed: list[int], title: str = "") -> bytes:
    """The frontier (time vs energy, with the LP lower bound) and the deployed points marked."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4.5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.plot(frontier.times, frontier.energies, "-", lw=1.5, label="frontier (true T, E)")
    ax.plot(frontier.times, frontier.lower_bounds, ":", lw=1, label="lower bound")
    ax.plot(
        [frontier.max_frequency_time], [frontier.max_frequency_energy], "kx", label="all max clocks"
    )
    for i in sorted(set(deployed)):
        ax.plot(
            [frontier.times[i]], [frontier.energies[i]], "o", ms=7, label=f"deployed: point {i}"
        )
    ax.set_xlabel("iteration time (s)")
    ax.set_ylabel("energy per iteration (J)")
    ax.set_title(title or "Perseus time-energy frontier")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()
