"""The instruction DAG of one pipeline iteration, as flat numpy arrays.

Nodes are the schedule's ops. Edges (``src[i] -> dst[i]``):

* the in-rank order: each op after the previous op of the same rank;
* activations flow forward: ``forward(c, m) -> forward(c + 1, m)``;
* gradients flow back: ``B(c + 1, m) -> B(c, m)``, where ``B`` is the op that produces the input
  gradient (``backward``, or ``backward_input`` in zero-bubble schedules);
* the loss: ``forward(N - 1, m) -> B(N - 1, m)``;
* ``backward_input(c, m) -> backward_weight(c, m)``.

Longest paths run level by level (all nodes whose longest chain of predecessors has the same
length are done in one vectorised step), so evaluating a plan costs O(levels) numpy calls, and
many plans can be evaluated at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from perseus.errors import ScheduleError
from perseus.schedules import Op, Schedule

__all__ = ["PipelineDAG", "KIND_CODES"]

KIND_CODES = {"forward": 0, "backward": 1, "backward_input": 2, "backward_weight": 3}
IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, eq=False)
class PipelineDAG:
    """Activity-on-node DAG of one iteration.

    Attributes:
        schedule: the schedule it was built from.
        ops: node ``i`` is ``ops[i]``; nodes are numbered rank by rank in execution order.
        rank, stage, microbatch, kind: per-node arrays (``kind`` holds :data:`KIND_CODES`).
        src, dst: edge lists.
        topo: nodes in a topological order; ``level_ptr`` splits it into levels.
        pred_ptr/pred_idx, succ_ptr/succ_idx: predecessor and successor lists (CSR).
    """

    schedule: Schedule
    ops: tuple[Op, ...]
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
        return len(self.ops)

    @property
    def num_ranks(self) -> int:
        return self.schedule.ranks

    @classmethod
    def from_schedule(cls, schedule: Schedule) -> PipelineDAG:
        ops: list[Op] = [op for order in schedule.orders for op in order]
        index = {op: i for i, op in enumerate(ops)}
        n = len(ops)
        src: list[int] = []
        dst: list[int] = []
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
                    src.append(v)
                    dst.append(index[Op("forward", m, c + 1)])
                else:
                    src.append(v)
                    dst.append(index[_grad_op(index, m, c)])
            elif k in ("backward", "backward_input"):
                if c > 0:
                    src.append(v)
                    dst.append(index[_grad_op(index, m, c - 1)])
                if k == "backward_input":
                    src.append(v)
                    dst.append(index[Op("backward_weight", m, c)])
        src_a = np.asarray(src, dtype=np.int64)
        dst_a = np.asarray(dst, dtype=np.int64)

        # Longest-chain levels (Kahn's algorithm, one frontier at a time).
        indeg = np.bincount(dst_a, minlength=n)
        order_e = np.argsort(src_a, kind="stable")
        out_ptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(src_a, minlength=n), out=out_ptr[1:])
        out_dst = dst_a[order_e]
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
        topo = np.concatenate(topo_parts) if topo_parts else np.empty(0, np.int64)
        if topo.size != n:
            stuck = [ops[v] for v in np.flatnonzero(remaining > 0)[:3]]
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
            rank=np.array([r for r, o in enumerate(schedule.orders) for _ in o], dtype=np.int64),
            stage=np.array([op.stage for op in ops], dtype=np.int64),
            microbatch=np.array([op.microbatch for op in ops], dtype=np.int64),
            kind=np.array([KIND_CODES[op.kind] for op in ops], dtype=np.int64),
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
