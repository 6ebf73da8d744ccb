"""The instruction DAG (edges, CSR lists, longest paths, slack) and plan evaluation."""

from __future__ import annotations

import numpy as np
import pytest

from perseus.dag import KIND_CODES, PipelineDAG
from perseus.errors import ProfileError
from perseus.problem import EnergyProblem
from perseus.profiles import InstructionProfile, Profile
from perseus.schedules import Op, Schedule, gpipe, interleaved_1f1b, make_schedule, one_f_one_b

F, B, BI, BW = "forward", "backward", "backward_input", "backward_weight"


def durations(dag: PipelineDAG, fwd: float, bwd: float) -> np.ndarray:
    return np.where(dag.kind == KIND_CODES[F], fwd, bwd).astype(np.float64)


@pytest.mark.parametrize(("stages", "microbatches"), [(4, 6), (4, 2), (3, 1), (1, 5), (8, 12)])
def test_unit_durations_give_the_textbook_iteration_time(stages: int, microbatches: int) -> None:
    for sched in (one_f_one_b(stages, microbatches), gpipe(stages, microbatches)):
        dag = PipelineDAG.from_schedule(sched)
        assert dag.iteration_time(durations(dag, 1.0, 1.0)) == 2 * (microbatches + stages - 1)
        # forward f, backward b: (M + S - 1) (f + b), the bubble being (S - 1)(f + b)
        assert dag.iteration_time(durations(dag, 1.0, 2.0)) == 3 * (microbatches + stages - 1)


def edge_set(dag: PipelineDAG) -> set[tuple[Op, Op]]:
    return {(dag.ops[a], dag.ops[b]) for a, b in zip(dag.src, dag.dst, strict=True)}


def test_edges_of_1f1b_two_stages_two_microbatches() -> None:
    dag = PipelineDAG.from_schedule(one_f_one_b(2, 2))
    # rank 0: F0 F1 B0 B1; rank 1: F0 B0 F1 B1
    f = {(m, s): Op(F, m, s) for m in range(2) for s in range(2)}
    b = {(m, s): Op(B, m, s) for m in range(2) for s in range(2)}
    expected = {
        # in-rank order
        (f[0, 0], f[1, 0]), (f[1, 0], b[0, 0]), (b[0, 0], b[1, 0]),
        (f[0, 1], b[0, 1]), (b[0, 1], f[1, 1]), (f[1, 1], b[1, 1]),
        # activations
        (f[0, 0], f[0, 1]), (f[1, 0], f[1, 1]),
        # loss (the same pairs as two in-rank edges here)
        (f[0, 1], b[0, 1]), (f[1, 1], b[1, 1]),
        # gradients
        (b[0, 1], b[0, 0]), (b[1, 1], b[1, 0]),
    }  # fmt: skip
    assert edge_set(dag) == expected
    assert dag.ops == one_f_one_b(2, 2).orders[0] + one_f_one_b(2, 2).orders[1]
    assert dag.rank.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert dag.stage.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert dag.microbatch.tolist() == [0, 1, 0, 1, 0, 0, 1, 1]
    assert dag.kind.tolist() == [0, 0, 1, 1, 0, 1, 0, 1]


def test_edges_of_a_zero_bubble_order() -> None:
    s = Schedule.from_orders(
        [[Op(F, 0, 0), Op(BI, 0, 0), Op(BW, 0, 0)], [Op(F, 0, 1), Op(BI, 0, 1), Op(BW, 0, 1)]]
    )
    dag = PipelineDAG.from_schedule(s)
    f0, i0, w0, f1, i1, w1 = s.orders[0] + s.orders[1]
    assert edge_set(dag) == {
        (f0, i0), (i0, w0), (f1, i1), (i1, w1),  # in rank (and input -> weight gradient)
        (f0, f1),  # activation
        (i1, i0),  # the input gradient flows back, not the weight gradient
    }  # fmt: skip
    assert dag.iteration_time(np.array([1.0, 2.0, 3.0, 1.0, 2.0, 3.0])) == 1 + 1 + 2 + 2 + 3


def test_edges_of_interleaved_cross_ranks_between_chunks() -> None:
    dag = PipelineDAG.from_schedule(interleaved_1f1b(2, 2, 2))
    e = edge_set(dag)
    for m in range(2):
        # model stage 1 (rank 1) feeds model stage 2 (rank 0), and gradients return
        assert (Op(F, m, 1), Op(F, m, 2)) in e
        assert (Op(F, m, 3), Op(B, m, 3)) in e
        assert (Op(B, m, 2), Op(B, m, 1)) in e
    assert dag.num_ranks == 2 and dag.num_nodes == 16


@pytest.mark.parametrize(
    "sched",
    [one_f_one_b(4, 6), gpipe(3, 4), interleaved_1f1b(2, 4, 2), interleaved_1f1b(3, 6, 3)],
    ids=lambda s: f"{s.name}-{s.stages}x{s.microbatches}",
)
def test_topology_and_csr_lists_are_consistent(sched: Schedule) -> None:
    dag = PipelineDAG.from_schedule(sched)
    n = dag.num_nodes
    assert sorted(dag.topo.tolist()) == list(range(n))
    pos = np.empty(n, dtype=np.int64)
    pos[dag.topo] = np.arange(n)
    assert np.all(pos[dag.src] < pos[dag.dst])
    assert dag.level_ptr[0] == 0 and dag.level_ptr[-1] == n
    for v in range(n):
        preds = sorted(dag.pred_idx[dag.pred_ptr[v] : dag.pred_ptr[v + 1]].tolist())
        succs = sorted(dag.succ_idx[dag.succ_ptr[v] : dag.succ_ptr[v + 1]].tolist())
        assert preds == sorted(dag.src[dag.dst == v].tolist())
        assert succs == sorted(dag.dst[dag.src == v].tolist())
    # exactly one source (the first forward of stage 0) and one sink (the last op of rank 0)
    sources = [dag.ops[v] for v in range(n) if dag.pred_ptr[v] == dag.pred_ptr[v + 1]]
    assert sources == [Op(F, 0, 0)]
    sinks = [dag.ops[v] for v in range(n) if dag.succ_ptr[v] == dag.succ_ptr[v + 1]]
    assert sinks == [sched.orders[0][-1]]


def test_longest_path_start_finish_and_slack() -> None:
    dag = PipelineDAG.from_schedule(one_f_one_b(4, 6))
    rng = np.random.default_rng(7)
    d = rng.uniform(0.5, 2.0, dag.num_nodes)
    es = dag.earliest_start(d)
    T = dag.iteration_time(d)
    assert T == pytest.approx(float((es + d).max()))
    # every edge respected, and every node starts as soon as its last predecessor finishes
    assert np.all(es[dag.dst] >= es[dag.src] + d[dag.src] - 1e-12)
    for v in range(dag.num_nodes):
        p = dag.pred_idx[dag.pred_ptr[v] : dag.pred_ptr[v + 1]]
        assert es[v] == pytest.approx(float((es[p] + d[p]).max()) if p.size else 0.0)
    lf = dag.latest_finish(d, T)
    slack = lf - d - es
    assert np.all(slack >= -1e-12)
    assert np.all(lf[dag.src] <= lf[dag.dst] - d[dag.dst] + 1e-12)
    # walk the critical path back from the last finisher: all of it has zero slack
    v = int(np.argmax(es + d))
    path = [v]
    while dag.pred_ptr[v] < dag.pred_ptr[v + 1]:
        p = dag.pred_idx[dag.pred_ptr[v] : dag.pred_ptr[v + 1]]
        v = int(p[np.argmax(es[p] + d[p])])
        path.append(v)
    assert es[path[-1]] == 0.0
    assert sum(d[path]) == pytest.approx(T)
    np.testing.assert_allclose(slack[path], 0.0, atol=1e-12)
    # with a later deadline every node gains exactly that much float
    np.testing.assert_allclose(dag.latest_finish(d, T + 3.0) - d - es, slack + 3.0, atol=1e-12)
    # shortening an op with slack does not change the iteration time; lengthening a critical one
    # does, by as much
    off = int(np.argmax(slack))
    assert slack[off] > 0
    d2 = d.copy()
    d2[off] += slack[off] * 0.5
    assert dag.iteration_time(d2) == pytest.approx(T)
    d3 = d.copy()
    d3[path[1]] += 0.25
    assert dag.iteration_time(d3) == pytest.approx(T + 0.25)


def test_batched_longest_paths_match_one_at_a_time() -> None:
    dag = PipelineDAG.from_schedule(interleaved_1f1b(2, 4, 2))
    d = np.random.default_rng(3).uniform(0.1, 1.0, (5, dag.num_nodes))
    es = dag.earliest_start(d)
    ts = dag.iteration_time(d)
    for k in range(5):
        np.testing.assert_allclose(es[k], dag.earliest_start(d[k]))
        assert ts[k] == pytest.approx(dag.iteration_time(d[k]))


# --- plan evaluation ------------------------------------------------------------------------


def hand_profile() -> Profile:
    def ip(fast: tuple[float, float], slow: tuple[float, float]) -> InstructionProfile:
        return InstructionProfile(
            np.array([1000, 500]), np.array([fast[0], slow[0]]), np.array([fast[1], slow[1]])
        )

    return Profile(
        {
            (0, F): ip((1.0, 10.0), (1.5, 8.0)),
            (0, B): ip((2.0, 20.0), (3.0, 17.0)),
            (1, F): ip((1.0, 12.0), (2.0, 9.0)),
            (1, B): ip((2.0, 22.0), (2.5, 20.0)),
        }
    )


def test_evaluate_matches_a_hand_computation() -> None:
    problem = EnergyProblem.build(hand_profile(), one_f_one_b(2, 2), 4.0)
    dag = problem.dag
    # nodes: rank 0 F0 F1 B0 B1, rank 1 F0 B0 F1 B1; option 0 = 1000 MHz, 1 = 500 MHz
    assert [(o.kind[0], o.microbatch, o.stage) for o in dag.ops] == [
        ("f", 0, 0), ("f", 1, 0), ("b", 0, 0), ("b", 1, 0),
        ("f", 0, 1), ("b", 0, 1), ("f", 1, 1), ("b", 1, 1),
    ]  # fmt: skip
    plan = np.array([1, 0, 0, 1, 0, 1, 1, 0], dtype=np.uint8)
    # F0@0 [0, 1.5]  F1@0 [1.5, 2.5]  F0@1 [1.5, 2.5]  B0@1 [2.5, 5]  F1@1 [5, 7]
    # B0@0 [5, 7]  B1@1 [7, 9]  B1@0 [9, 12]  -> T = 12
    # compute energy 8 + 10 + 20 + 17 + 12 + 20 + 9 + 22 = 118; busy 7.5 + 7.5 = 15
    # idle 2 * 12 - 15 = 9 at 4 W -> 36 J
    ev = problem.evaluate(plan)
    assert ev.time == pytest.approx(12.0)
    assert ev.energy == pytest.approx(118.0 + 36.0)
    np.testing.assert_allclose(problem.durations(plan), [1.5, 1, 2, 3, 1, 2.5, 2, 2])
    assert problem.frequencies_of(plan).tolist() == [500, 1000, 1000, 500, 1000, 500, 500, 1000]
    # all fast: F0@0 [0,1] F1@0 [1,2] F0@1 [1,2] B0@1 [2,4] F1@1 [4,5] B0@0 [4,6] B1@1 [5,7]
    # B1@0 [7,9]; compute 10 + 10 + 20 + 20 + 12 + 22 + 12 + 22 = 128; busy 6 + 6; idle 18 - 12
    fast = problem.evaluate(problem.max_frequency_plan())
    assert (fast.time, fast.energy) == pytest.approx((9.0, 128.0 + 4.0 * 6.0))
    ts, es = problem.evaluate_many(np.stack([plan, problem.max_frequency_plan()]))
    np.testing.assert_allclose(ts, [12.0, 9.0])
    np.testing.assert_allclose(es, [154.0, 152.0])


def test_evaluate_rejects_bad_plans() -> None:
    problem = EnergyProblem.build(hand_profile(), one_f_one_b(2, 2), 4.0)
    with pytest.raises(ValueError, match="option index"):
        problem.evaluate(np.full(8, 2, dtype=np.uint8))
    with pytest.raises(ValueError, match="shape"):
        problem.evaluate_many(np.zeros((1, 7), dtype=np.uint8))


@pytest.mark.parametrize("power", [-1.0, float("nan"), float("inf")])
def test_blocking_power_must_be_finite_and_non_negative(power: float) -> None:
    with pytest.raises(ProfileError, match="blocking_power"):
        EnergyProblem.build(hand_profile(), one_f_one_b(2, 2), power)


def test_profile_and_schedule_stage_counts_must_agree() -> None:
    with pytest.raises(ProfileError, match="2 stages but the job has 3") as info:
        EnergyProblem.build(hand_profile(), one_f_one_b(3, 2), 4.0)
    assert info.value.field == "stages"


def test_per_rank_profile_splits_over_virtual_stages() -> None:
    # a 2-stage profile for a 2-rank pipeline with 2 chunks per rank: each chunk takes half
    problem = EnergyProblem.build(hand_profile(), make_schedule("interleaved-1f1b", 2, 2, 2), 4.0)
    for v, op in enumerate(problem.dag.ops):
        rank = int(problem.dag.rank[v])
        full = hand_profile()[(rank, op.kind)]
        np.testing.assert_allclose(problem.times[v], full.times / 2)
        np.testing.assert_allclose(problem.energies[v], full.energies / 2)


def test_split_backward_takes_half_of_the_measured_backward() -> None:
    s = Schedule.from_orders(
        [[Op(F, 0, 0), Op(BI, 0, 0), Op(BW, 0, 0)], [Op(F, 0, 1), Op(BI, 0, 1), Op(BW, 0, 1)]]
    )
    problem = EnergyProblem.build(hand_profile(), s, 4.0)
    full = hand_profile()[(1, B)]
    np.testing.assert_allclose(problem.times[4], full.times * 0.5)
    np.testing.assert_allclose(problem.energies[5], full.energies * 0.5)
