"""The instruction DAG of one pipeline iteration, as flat numpy arrays.

Nodes are the schedule's ops. Edges (``src[i] -> dst[i]``):

* the in-rank order: each op after the previous op of the same rank;
* activations flow forward: ``forward(c, m) -> forward(c + 1, m)``;
* gradients flow back: ``B(c + 1, m) -> B(c, m)``, where ``B`` is the op that produces the input
  gradient (``backward``, or ``backward_input`` in zero-bubble schedules);
* the loss: ``forward(N - 1, m) -> B(N - 1, m)``;
* ``backward_input(c, m) -> backward_weight(c, m)``.

With communication (built by :class:`~perseus.problem.EnergyProblem` from a profile's
:class:`~perseus_common.communication.Communication`), two more kinds of node follow the ops,
numbered after them (ops are nodes ``0..num_ops-1``, in the same order as without
communication, so a plan's per-rank steps are unchanged):

* a *transfer* node on a cross-rank data edge: ``forward(c, m) -> T -> forward(c + 1, m)``
  (boundary ``c``, direction ``forward``) and ``B(c + 1, m) -> T -> B(c, m)`` (boundary ``c``,
  direction ``backward``); none between two model stages on the same rank;
* a *phase* node per rank with iteration-end phases, after the rank's last op.

Longest paths run level by level (all nodes whose longest chain of predecessors has the same
length are done in one vectorised step), so evaluating a plan costs O(levels) numpy calls, and
many plans can be evaluated at once.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from perseus.errors import ScheduleError
from perseus.schedules import Op, Schedule

__all__ = ["PipelineDAG", "KIND_CODES", "CommNode"]

KIND_CODES = {
    "forward": 0,
    "backward": 1,
    "backward_input": 2,
    "backward_weight": 3,
    "transfer_forward": 4,
    "transfer_backward": 5,
    "phase": 6,
}


@dataclass(frozen=True)
class CommNode:
    """A node that is not an op: a transfer or a ``phase`` node.

    A transfer has ``kind`` ``transfer_forward`` / ``transfer_backward`` across model
    ``boundary`` for ``microbatch``, from node ``producer`` to node ``consumer``, on the
    receiving ``rank``. A ``phase`` node holds the iteration-end phases of ``rank``, after its
    last op ``producer``; its ``boundary``, ``microbatch`` and ``consumer`` are -1.
    """

    kind: str
    rank: int
    boundary: int
    microbatch: int
    producer: int
    consumer: int


IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, eq=False)
class PipelineDAG:
    """Activity-on-node DAG of one iteration.

    Attributes:
        schedule: the schedule it was built from.
        ops: node ``i < num_ops`` is ``ops[i]``; ops are numbered rank by rank in execution order.
        comm: node ``num_ops + j`` is ``comm[j]`` (transfers, then phases; empty without
            communication).
        rank, stage, microbatch, kind: per-node arrays (``kind`` holds :data:`KIND_CODES`; a
            transfer's rank is the receiver's, its stage and a phase's stage and microbatch -1).
        src, dst: edge lists.
        topo: nodes in a topological order; ``level_ptr`` splits it into levels.
        pred_ptr/pred_idx, succ_ptr/succ_idx: predecessor and successor lists (CSR).
    """

    schedule: Schedule
    ops: tuple[Op, ...]
    comm: tuple[CommNode, ...]
    rank: IntArray
    stage: IntArray
    microbatch: IntArray
    kind: IntArray
    src: IntArray
    dst: IntArray
    topo: IntArray
    level_ptr: IntArray
    level_edges: tuple[IntArray, ...]
    pred_ptr: IntArray
    pred_idx: IntArray
    succ_ptr: IntArray
    succ_idx: IntArray

    @property
    def num_nodes(self) -> int:
        """Every node: the ops, then the transfer and phase nodes."""
        return len(self.ops) + len(self.comm)

    @property
    def num_ops(self) -> int:
        """Nodes ``0..num_ops-1`` are the schedule's ops (the ones a plan gives clocks)."""
        return len(self.ops)

    @property
    def num_ranks(self) -> int:
        """The number of pipeline ranks in the schedule."""
        return self.schedule.ranks

    @classmethod
    def from_schedule(
        cls,
        schedule: Schedule,
        *,
        transfers: Collection[tuple[int, str]] = (),
        phase_ranks: Collection[int] = (),
    ) -> PipelineDAG:
        """The DAG of ``schedule``, with transfer and phase nodes where asked.

        A transfer node sits on each cross-rank data edge whose ``(model boundary,
        direction)`` is in ``transfers``, and a phase node after the last op of each rank in
        ``phase_ranks``.
        """
        ops: list[Op] = [op for order in schedule.orders for op in order]
        comm, src, dst = _edges(schedule, ops, set(transfers), phase_ranks)
        n_ops = len(ops)
        n = n_ops + len(comm)
        src_a = np.asarray(src, dtype=np.int64)
        dst_a = np.asarray(dst, dtype=np.int64)
        order_e = np.argsort(src_a, kind="stable")
        out_ptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(src_a, minlength=n), out=out_ptr[1:])
        out_dst = dst_a[order_e]
        topo_parts, level, remaining = _levels(dst_a, out_ptr, out_dst)
        depth = len(topo_parts)
        topo = np.concatenate(topo_parts) if topo_parts else np.empty(0, np.int64)
        if topo.size != n:
            stuck = [ops[v] for v in np.flatnonzero(remaining[:n_ops] > 0)[:3]]
            raise ScheduleError(
                "the schedule deadlocks: some instructions wait on each other in a cycle, e.g. "
                + ", ".join(
                    f"rank {schedule.stage_rank()[o.stage]} {o.kind} mb {o.microbatch}"
                    for o in stuck
                )
            )
        level_ptr = np.zeros(depth + 1, dtype=np.int64)
        np.cumsum([len(p) for p in topo_parts], out=level_ptr[1:])
        dst_level = level[dst_a]
        by_level = np.argsort(dst_level, kind="stable")
        counts = np.bincount(dst_level, minlength=depth)
        bounds = np.concatenate([[0], np.cumsum(counts)])
        level_edges = tuple(by_level[bounds[d] : bounds[d + 1]] for d in range(depth))
        by_dst = np.argsort(dst_a, kind="stable")
        pred_ptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(dst_a, minlength=n), out=pred_ptr[1:])
        return cls(
            schedule=schedule,
            ops=tuple(ops),
            comm=tuple(comm),
            rank=np.array(
                [r for r, o in enumerate(schedule.orders) for _ in o] + [c.rank for c in comm],
                dtype=np.int64,
            ),
            stage=np.array([op.stage for op in ops] + [-1] * len(comm), dtype=np.int64),
            microbatch=np.array(
                [op.microbatch for op in ops] + [c.microbatch for c in comm], dtype=np.int64
            ),
            kind=np.array(
                [KIND_CODES[op.kind] for op in ops] + [KIND_CODES[c.kind] for c in comm],
                dtype=np.int64,
            ),
            src=src_a,
            dst=dst_a,
            topo=topo,
            level_ptr=level_ptr,
            level_edges=level_edges,
            pred_ptr=pred_ptr,
            pred_idx=src_a[by_dst],
            succ_ptr=out_ptr,
            succ_idx=out_dst,
        )

    def earliest_start(self, durations: FloatArray) -> FloatArray:
        """Earliest start of every node; ``durations`` has shape ``(n,)`` or ``(k, n)``."""
        d = np.asarray(durations, dtype=np.float64)
        es = np.zeros_like(d)
        src, dst = self.src, self.dst
        if d.ndim == 1:
            for e in self.level_edges[1:]:
                if e.size:
                    np.maximum.at(es, dst[e], es[src[e]] + d[src[e]])
        else:
            for e in self.level_edges[1:]:
                if e.size:
                    vals = es[:, src[e]] + d[:, src[e]]
                    # maximum.at over the node axis for every row at once
                    tmp = es.T
                    np.maximum.at(tmp, dst[e], vals.T)
        return es

    def latest_finish(self, durations: FloatArray, deadline: float) -> FloatArray:
        """Latest finish of every node (1-D ``durations``) so the iteration ends by ``deadline``."""
        d = np.asarray(durations, dtype=np.float64)
        lf = np.full_like(d, deadline)
        src, dst = self.src, self.dst
        for e in reversed(self.level_edges[1:]):
            if e.size:
                np.minimum.at(lf, src[e], lf[dst[e]] - d[dst[e]])
        return lf

    def iteration_time(self, durations: FloatArray) -> FloatArray | float:
        """Longest path length (per row for 2-D ``durations``)."""
        d = np.asarray(durations, dtype=np.float64)
        ef = self.earliest_start(d) + d
        return float(ef.max()) if d.ndim == 1 else ef.max(axis=1)


def _grad_op(index: dict[Op, int], m: int, c: int) -> Op:
    op = Op("backward", m, c)
    return op if op in index else Op("backward_input", m, c)


def _edges(
    schedule: Schedule, ops: list[Op], wanted: set[tuple[int, str]], phase_ranks: Collection[int]
) -> tuple[list[CommNode], list[int], list[int]]:
    """The non-op nodes and the edge list of the DAG over ``ops`` (numbered as given).

    The edges: in-rank order, data edges (through a transfer node where ``(boundary,
    direction)`` is ``wanted`` and crosses ranks), and an edge into each phase node of
    ``phase_ranks``.
    """
    index = {op: i for i, op in enumerate(ops)}
    n_ops = len(ops)
    rank_of = schedule.stage_rank()
    comm: list[CommNode] = []
    src: list[int] = []
    dst: list[int] = []

    def data_edge(u: int, v: int, boundary: int, direction: str, m: int) -> None:
        a, b = (boundary, boundary + 1) if direction == "forward" else (boundary + 1, boundary)
        if (boundary, direction) in wanted and rank_of[a] != rank_of[b]:
            w = n_ops + len(comm)
            comm.append(CommNode(f"transfer_{direction}", rank_of[b], boundary, m, u, v))
            src.extend((u, w))
            dst.extend((w, v))
        else:
            src.append(u)
            dst.append(v)

    i = 0
    for order in schedule.orders:
        for j in range(1, len(order)):
            src.append(i + j - 1)
            dst.append(i + j)
        i += len(order)
    last = schedule.stages - 1
    for op, v in index.items():
        k, m, c = op
        if k == "forward":
            if c + 1 <= last:
                data_edge(v, index[Op("forward", m, c + 1)], c, "forward", m)
            else:
                src.append(v)
                dst.append(index[_grad_op(index, m, c)])
        elif k in ("backward", "backward_input"):
            if c > 0:
                data_edge(v, index[_grad_op(index, m, c - 1)], c - 1, "backward", m)
            if k == "backward_input":
                src.append(v)
                dst.append(index[Op("backward_weight", m, c)])
    i = 0
    for r, order in enumerate(schedule.orders):
        i += len(order)
        if r in phase_ranks and order:
            w = n_ops + len(comm)
            comm.append(CommNode("phase", r, -1, -1, i - 1, -1))
            src.append(i - 1)
            dst.append(w)
    return comm, src, dst


def _levels(
    dst: IntArray, out_ptr: IntArray, out_dst: IntArray
) -> tuple[list[IntArray], IntArray, IntArray]:
    """Longest-chain levels by Kahn's algorithm, one frontier at a time.

    Returns the frontiers in order, each node's level, and each node's count of predecessors
    never done (nonzero on a cycle).
    """
    n = len(out_ptr) - 1
    indeg = np.bincount(dst, minlength=n)
    level = np.zeros(n, dtype=np.int64)
    frontier = np.flatnonzero(indeg == 0)
    topo_parts = []
    remaining = indeg.copy()
    depth = 0
    while frontier.size:
        topo_parts.append(frontier)
        level[frontier] = depth
        starts, ends = out_ptr[frontier], out_ptr[frontier + 1]
        succ = (
            np.concatenate([out_dst[a:b] for a, b in zip(starts, ends, strict=True)])
            if frontier.size
            else np.empty(0, np.int64)
        )
        np.subtract.at(remaining, succ, 1)
        frontier = np.unique(succ[remaining[succ] == 0])
        depth += 1
    return topo_parts, level, remaining
