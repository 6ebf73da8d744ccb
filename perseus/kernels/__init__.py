"""The solver's compiled kernels (numba, ``cache=True``: compiled once, then loaded from disk).

One algorithm per module, each on flat integer/float arrays (the DAG as CSR predecessor and
successor lists in a topological order, flow networks as arc arrays; no Python objects on the
hot path), each releasing the GIL (``nogil``) so that batches can be split over threads:

* :mod:`~perseus.kernels.longest_paths`: earliest starts, latest finishes, iteration times
  (the critical path method);
* :mod:`~perseus.kernels.flow`: maximum flow (Dinic) and the minimum cut of a network with lower
  bounds;
* :mod:`~perseus.kernels.network_simplex`: a warm-startable minimum-cost circulation (the
  relaxation at one deadline, for the sandwich core);
* :mod:`~perseus.kernels.relaxed`: exact steps of the Phillips-Dessouky min-cut iteration along
  the relaxed (convex-hull) frontier;
* :mod:`~perseus.kernels.rounding`: rounding relaxed durations to measured options, and
  reclaiming a plan's slack;
* :mod:`~perseus.kernels.exchange`: exchanges, a local search that speeds one node up to let
  others slow down;
* :mod:`~perseus.kernels.search`: a large-neighbourhood search (ruin and recreate) and the
  repair of a plan that overruns its deadline.

:class:`perseus.solver.Rounder` wraps the plan kernels for Python callers; most code should use
it, or :func:`perseus.solver.solve_problem`, rather than these. :mod:`~perseus.kernels.cache`
says where the compiled kernels are kept; ``python -m perseus.kernels.warm`` compiles them ahead
of time.
"""

from __future__ import annotations

from pathlib import Path

from perseus.kernels.cache import NO_KERNELS, configure_cache, drop_stale_caches

_HERE = Path(__file__).resolve().parent
drop_stale_caches(_HERE, exclude=NO_KERNELS)
configure_cache(_HERE)

from perseus.kernels.exchange import exchange  # noqa: E402
from perseus.kernels.flow import dinic, min_cut_lower_bounds  # noqa: E402
from perseus.kernels.longest_paths import (  # noqa: E402
    earliest_start,
    earliest_start_into,
    earliest_start_k,
    iteration_times,
    latest_finish,
    latest_finish_into,
    ready_time,
)
from perseus.kernels.relaxed import relaxed_chunk  # noqa: E402
from perseus.kernels.rounding import reclaim, reclaim_plans, round_and_reclaim, top_rate  # noqa: E402
from perseus.kernels.search import repair, search_plans  # noqa: E402

__all__ = [
    "configure_cache",
    "dinic",
    "drop_stale_caches",
    "earliest_start",
    "earliest_start_into",
    "earliest_start_k",
    "exchange",
    "iteration_times",
    "latest_finish",
    "latest_finish_into",
    "min_cut_lower_bounds",
    "ready_time",
    "reclaim",
    "reclaim_plans",
    "relaxed_chunk",
    "repair",
    "round_and_reclaim",
    "search_plans",
    "top_rate",
]
