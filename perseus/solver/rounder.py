"""Discrete plans from relaxed durations, and better plans from existing ones.

:class:`Rounder` is the Python face of the plan kernels (:mod:`perseus.kernels.rounding`,
:mod:`perseus.kernels.exchange`, :mod:`perseus.kernels.search`): it sorts every node's Pareto
options by time once, converts plans (option indices, as :class:`~perseus.problem.EnergyProblem`
and :class:`~perseus.frontier.Frontier` hold them) to and from positions in that order, and runs
the kernels on batches of plans. The kernels release the GIL, so batches may be split over
threads.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from perseus.kernels.rounding import reclaim_plans, round_and_reclaim
from perseus.kernels.search import search_plans
from perseus.problem import EnergyProblem
from perseus.solver.options import RoundingOptions
from perseus.solver.relaxation import Relaxation

__all__ = ["Rounder"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
PlanArray = npt.NDArray[np.uint8]


class Rounder:
    """Rounds relaxed durations to measured plans within deadlines, reclaims the slack of
    existing plans, and improves them by exchanges and by search.

    Plans in and out are option indices ``(k, n)`` (``uint8``, as in
    :class:`~perseus.problem.EnergyProblem`); every plan that comes out uses only Pareto-optimal
    options and finishes within its deadline.

    Attributes:
        problem: the problem plans are for.
        options: how slack is reclaimed.
        order: ``(n, K)`` each node's option indices by increasing time (Pareto options
            first; entries past ``nopt`` are padding).
        nopt: ``(n,)`` how many Pareto options each node has.
        times, costs, hull: ``(n, K)`` those options' times, effective costs (``e - P t``) and
            whether each is a vertex of the node's lower hull, in that order.
        position: ``(n, K)`` the position of each option index in ``order`` (-1: dominated).
        dag: the DAG as the kernels take it: ``(topo, pred_ptr, pred_idx, succ_ptr, succ_idx)``.
        rank_ptr: ``(ranks + 1,)`` where each rank's nodes start (nodes are numbered rank by
            rank).
        diag: ``(stages, kinds, microbatches)`` the node of each (model stage, kind,
            microbatch), -1 where there is none; the search's diagonal moves follow it.
    """

    def __init__(
        self,
        problem: EnergyProblem,
        relaxation: Relaxation,
        options: RoundingOptions | None = None,
    ) -> None:
        rel = relaxation
        self.options = options or RoundingOptions()
        times = np.where(rel.pareto, problem.times, np.inf)
        order = np.argsort(times, axis=1, kind="stable")
        costs = problem.energies - problem.blocking_power * problem.times
        # Each node's Pareto options by increasing time, with their costs and hull flags
        # (entries past nopt are padding and never read).
        self.order = order.astype(np.int64)
        self.nopt = rel.pareto.sum(axis=1).astype(np.int64)
        self.times = np.ascontiguousarray(np.take_along_axis(problem.times, order, axis=1))
        self.costs = np.ascontiguousarray(np.take_along_axis(costs, order, axis=1))
        self.hull = np.ascontiguousarray(np.take_along_axis(rel.hull_mask, order, axis=1))
        # position of each Pareto option in that order (-1: dominated)
        self.position = np.full(order.shape, -1, dtype=np.int64)
        cols = np.arange(order.shape[1])[None, :]
        np.put_along_axis(self.position, order, np.where(cols < self.nopt[:, None], cols, -1), 1)
        self.problem = problem
        d = problem.dag
        self.dag = (d.topo, d.pred_ptr, d.pred_idx, d.succ_ptr, d.succ_idx)
        # nodes are numbered rank by rank: where each rank's run starts
        self.rank_ptr = np.searchsorted(d.rank, np.arange(d.num_ranks + 1)).astype(np.int64)
        # the node of each (stage, kind, microbatch), -1 where there is none
        diag = np.full(
            (int(d.stage.max()) + 1, int(d.kind.max()) + 1, int(d.microbatch.max()) + 1), -1
        )
        diag[d.stage, d.kind, d.microbatch] = np.arange(len(d.stage))
        self.diag = diag.astype(np.int64)

    def with_times(self, times: FloatArray) -> Rounder:
        """A copy whose options take other times, everything else shared.

        ``times`` is ``(n, K)``, in this rounder's sorted order, still increasing along each
        row up to ``nopt``: a model whose durations differ and whose effective costs differ by
        a constant per node at most (constants change no decision here).
        """
        out = object.__new__(Rounder)
        out.__dict__.update(self.__dict__)
        out.times = np.ascontiguousarray(times, dtype=np.float64)
        return out

    def _options(self, picks: IntArray) -> PlanArray:
        return self.order[np.arange(picks.shape[1])[None, :], picks].astype(np.uint8)

    def _improve(
        self, plans: PlanArray, kernel: Callable[[IntArray, BoolArray], IntArray]
    ) -> PlanArray:
        """``plans`` (option indices) passed to ``kernel`` as positions in the sorted options,
        with the mask of the rows it gets; rows using a dominated option come back unchanged."""
        picks = self.position[np.arange(plans.shape[1])[None, :], plans]
        ok: BoolArray = np.asarray((picks >= 0).all(axis=1))
        out = plans.copy()
        if ok.any():
            out[ok] = self._options(kernel(picks[ok], ok))
        return out

    def round(
        self,
        durations: FloatArray,
        deadlines: FloatArray,
        jumps: BoolArray,
        up_at: FloatArray | None = None,
    ) -> PlanArray:
        """Plans (option indices, ``(k, n)``) for rows of relaxed ``durations``, each within its
        deadline.

        A node whose relaxed duration lies between two hull vertices goes to the slower one
        when it fits and the duration is past ``up_at`` (default one half) of the way there.
        The slack left is then reclaimed twice (first no node past the hull vertex at or above
        its relaxed duration, then freely), skipping over options where ``jumps``.
        """
        o = self.options
        durations = np.ascontiguousarray(durations, dtype=np.float64)
        if up_at is None:
            up_at = np.full(durations.shape, 0.5)
        picks = round_and_reclaim(
            self.dag, self.times, self.costs, self.hull, self.nopt, durations,
            np.asarray(deadlines, dtype=np.float64), np.ascontiguousarray(up_at, dtype=np.float64),
            np.asarray(jumps, dtype=np.bool_),
            o.levels, o.decay, o.free_levels, o.free_decay, o.max_rounds, o.exchange_passes,
        )  # fmt: skip
        return self._options(picks)

    def reclaim(
        self, plans: PlanArray, deadlines: FloatArray, exchange_passes: int | None = None
    ) -> PlanArray:
        """``plans`` (option indices) each given the slack up to its deadline, then improved by
        ``exchange_passes`` passes of exchanges (default: the options', none unless set).
        Plans using a dominated option are returned unchanged."""
        o = self.options
        passes = o.exchange_passes if exchange_passes is None else exchange_passes
        return self._improve(
            plans,
            lambda picks, ok: reclaim_plans(
                self.dag, self.times, self.costs, self.nopt, picks,
                np.asarray(deadlines, dtype=np.float64)[ok],
                o.levels, o.decay, o.max_rounds, passes,
            ),
        )  # fmt: skip

    def exchange(self, plans: PlanArray, deadlines: FloatArray, passes: int = 2) -> PlanArray:
        """``plans`` given the slack up to their deadlines, then improved by up to ``passes``
        passes of exchanges within them."""
        return self.reclaim(plans, deadlines, exchange_passes=passes)

    def search(
        self, plans: PlanArray, deadlines: FloatArray, seeds: IntArray, iters: int
    ) -> PlanArray:
        """``plans`` given the slack up to their deadlines, then improved by ``iters`` trials of
        a large-neighbourhood search each (seeded by ``seeds``). Plans using a dominated option
        are returned unchanged."""
        o = self.options
        return self._improve(
            plans,
            lambda picks, ok: search_plans(
                self.dag, self.times, self.costs, self.nopt, self.hull, self.rank_ptr, self.diag,
                picks, np.asarray(deadlines, dtype=np.float64)[ok], iters,
                np.asarray(seeds, dtype=np.int64)[ok], o.levels, o.decay,
            ),
        )  # fmt: skip

    def __call__(self, durations: FloatArray, deadline: float, jump: bool = True) -> PlanArray:
        """One plan for relaxed ``durations`` within ``deadline``."""
        return self.round(np.asarray(durations)[None, :], np.array([deadline]), np.array([jump]))[0]
