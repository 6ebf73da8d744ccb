"""Run lowtime on a profile the way the Perseus artifact drives it, and map its plans onto our DAG.

Lowtime is the Perseus authors' solver, ``lowtime==0.3.0``; every plan it produces is mapped onto
this project's DAG.

How the artifact drives lowtime (upstream lowtime repository, ``examples/perseus.py``; the
example is not shipped in the wheel or the sdist, so the steps below follow it as closely as we
know it, and every lowtime call is to the installed package):

1. Per (stage, instruction) build one ``ExecutionOption(real_time=time, unit_time=1e-3,
   cost=energy, knob=frequency)`` per profile row (``lowtime/operation.py``).
2. ``CandidateExecutionOptions`` keeps the options Pareto-optimal in (real time, *raw* energy),
   quantises time to ``int(real_time // unit_time)`` and, of options in the same quantum,
   keeps the most expensive (the fastest) one (``operation.py``,
   ``CandidateExecutionOptions.__attrs_post_init__``).
3. The cost is then made the *effective* compute energy: ``cost -= P_block * quant_time *
   unit_time`` (blocking power times the quantised time), and ``ExponentialModel`` fits
   ``a * exp(b * quant_time) + c`` to those points with its default grid search over initial
   guesses (``lowtime/cost_model.py``).
4. The activity-on-node DAG: nodes are ``Synchronous1F1B`` instructions of every stage in order
   (``lowtime/perseus/schedule.py``), consecutive instructions of a stage are chained, and
   ``DependencyResolver([forward_dep, backward_dep])`` adds forward(s, m) -> forward(s+1, m) and
   backward(s+1, m) -> backward(s, m) (``lowtime/perseus/instruction.py``,
   ``lowtime/graph_utils.py``); ``add_source_node`` / ``add_sink_node`` add dummy ends.
5. ``PhillipsDessouky(dag).run()`` starts from every instruction at its slowest option and
   yields after every 1-quantum reduction of the iteration time (``lowtime/solver.py``). After
   each iteration the artifact reads each instruction's ``assigned_knob``: setting an
   operation's ``duration`` picks, through ``CandidateExecutionOptions.get_knob_for``, the
   slowest candidate frequency whose quantised time fits in that duration. That frequency is the
   plan Perseus's server would push.

The only deviation: dependency rules are checked between instructions of adjacent stages only
(the rules can only hold there), which gives the same edges as checking every pair.

lowtime's own estimate of a plan is ``IterationResult.quant_time * unit_time`` for time and
``IterationResult.cost`` (the sum of fitted effective costs) for cost; ``cost + P_block * R *
time`` is the energy that cost implies. Both are estimates; :func:`run_lowtime` returns them
next to the plan, and ``EnergyProblem.evaluate`` gives the truth.

Run ``python benchmarks/lowtime_runner.py [--microbatches M] [--profile PATH] [--blocking-power W]``
(``--smoke``: 2 microbatches, what the test suite runs).
"""

from __future__ import annotations

import argparse
import itertools
import time
from dataclasses import dataclass
from pathlib import Path

import networkx as nx
import numpy as np
import numpy.typing as npt
from lowtime.cost_model import ExponentialModel
from lowtime.graph_utils import DependencyResolver, add_sink_node, add_source_node
from lowtime.operation import CandidateExecutionOptions, ExecutionOption, OperationSpec
from lowtime.perseus.instruction import Backward, Forward, Instruction, backward_dep, forward_dep
from lowtime.perseus.schedule import Synchronous1F1B
from lowtime.solver import PhillipsDessouky

from perseus.problem import EnergyProblem
from perseus.profiles import Profile, load_profile
from perseus.schedules import Op, one_f_one_b

__all__ = ["LowtimePlan", "LowtimeResult", "run_lowtime", "build_lowtime_dag"]

PlanArray = npt.NDArray[np.uint8]
_KINDS: dict[type[Instruction], str] = {Forward: "forward", Backward: "backward"}
_SOURCE, _SINK = 0, 1


@dataclass(frozen=True)
class LowtimePlan:
    """One Phillips–Dessouky iteration's plan.

    Attributes:
        iteration: lowtime's iteration number (1 = first reduction from all-slowest).
        time: lowtime's estimated iteration time, ``quant_time * unit_time`` (s).
        cost: lowtime's estimated total cost, the sum of fitted effective energies (J).
        energy: the energy that estimate implies, ``cost + P_block * R * time`` (J).
        plan: option index per node of ``EnergyProblem`` (``problem.freqs[i, plan[i]]`` is the
            frequency lowtime assigned to ``problem.dag.ops[i]``).
    """

    iteration: int
    time: float
    cost: float
    energy: float
    plan: PlanArray


@dataclass(frozen=True)
class LowtimeResult:
    """Outcome of :func:`run_lowtime`.

    Attributes:
        wall_time: seconds spent inside lowtime's solver (``PhillipsDessouky`` construction and
            every ``run()`` step), excluding our per-iteration plan extraction.
        cpu_time: process CPU seconds over the same span as ``wall_time`` (lowtime is
            single-threaded, so on a busy machine this is the fairer measure).
        setup_time: seconds to fit the cost models and build lowtime's DAG.
        plans: one per iteration, in the order lowtime yields them (slowest first; the last is
            lowtime's fastest plan).
        completed: False if ``time_limit`` stopped the solve early.
        problem: this project's problem the plans index into.
    """

    wall_time: float
    cpu_time: float
    setup_time: float
    plans: tuple[LowtimePlan, ...]
    completed: bool
    problem: EnergyProblem

    @property
    def fastest(self) -> LowtimePlan:
        if not self.plans:
            raise ValueError("lowtime produced no plan")
        return self.plans[-1]


def _operation_specs(
    profile: Profile, stages: int, blocking_power: float, unit_time: float
) -> dict[int, dict[type[Instruction], OperationSpec[int]]]:
    """Steps 1–3 of the module docstring.

    Candidate options and fitted cost model per (stage, instruction).
    """
    specs: dict[int, dict[type[Instruction], OperationSpec[int]]] = {}
    for stage in range(stages):
        specs[stage] = {}
        for inst, kind in _KINDS.items():
            p = profile[(stage, kind)]
            options = [
                ExecutionOption[int](
                    real_time=float(t), unit_time=unit_time, cost=float(e), knob=int(f)
                )
                for f, t, e in zip(p.frequencies, p.times, p.energies, strict=True)
            ]
            candidates = CandidateExecutionOptions[int](options=options)
            for option in candidates.options:
                option.cost -= blocking_power * option.quant_time * option.unit_time
            model = ExponentialModel(candidates)
            specs[stage][inst] = OperationSpec[int](options=candidates, cost_model=model)
    return specs


def build_lowtime_dag(
    specs: dict[int, dict[type[Instruction], OperationSpec[int]]], stages: int, microbatches: int
) -> tuple[nx.DiGraph, list[list[int]]]:
    """Step 4: lowtime's activity-on-node DAG of 1F1B; returns it and each stage's node ids."""
    dag = nx.DiGraph()
    node_id = 2  # 0 and 1 are the dummy source and sink
    per_stage: list[list[int]] = []
    for stage in range(stages):
        ids: list[int] = []
        for inst in Synchronous1F1B(
            num_stages=stages,
            num_micro_batches=microbatches,
            stage_id=stage,
            operation_spec_map=specs[stage],
        ):
            dag.add_node(node_id, op=inst)
            ids.append(node_id)
            node_id += 1
        per_stage.append(ids)
        for a, b in itertools.pairwise(ids):
            dag.add_edge(a, b)
    resolver = DependencyResolver(
        dependency_rules=[forward_dep, backward_dep], node_type=Instruction
    )
    for s in range(stages - 1):
        for a, b in itertools.chain(
            itertools.product(per_stage[s], per_stage[s + 1]),
            itertools.product(per_stage[s + 1], per_stage[s]),
        ):
            if resolver.is_dependent(dag.nodes[a]["op"], dag.nodes[b]["op"]):
                dag.add_edge(a, b)
    add_source_node(dag, _SOURCE)
    add_sink_node(dag, _SINK)
    dag.graph["source_node"] = _SOURCE
    dag.graph["sink_node"] = _SINK
    return dag, per_stage


def run_lowtime(
    profile_path: str,
    stages: int,
    microbatches: int,
    blocking_power: float,
    unit_time: float = 1e-3,
    time_limit: float | None = None,
) -> LowtimeResult:
    """Run lowtime's Phillips–Dessouky solver on 1F1B and map each iteration's plan onto our DAG.

    Onto ``EnergyProblem.build(load_profile(profile_path), one_f_one_b(stages, microbatches),
    blocking_power)``.

    ``time_limit`` (seconds of solve) stops the iteration early; the result then has
    ``completed=False`` and the plans found so far (the slowest ones).
    """
    profile = load_profile(profile_path)
    schedule = one_f_one_b(stages, microbatches)
    problem = EnergyProblem.build(profile, schedule, blocking_power)

    t0 = time.perf_counter()
    specs = _operation_specs(profile, stages, blocking_power, unit_time)
    dag, per_stage = build_lowtime_dag(specs, stages, microbatches)
    setup_time = time.perf_counter() - t0

    # Our node i -> lowtime's operation object; check the two 1F1B orders agree node by node.
    index = {op: i for i, op in enumerate(problem.dag.ops)}
    ops: list[Instruction] = [None] * problem.num_nodes  # type: ignore[list-item]
    for stage, ids in enumerate(per_stage):
        ours = schedule.orders[stage]
        theirs = [dag.nodes[n]["op"] for n in ids]
        converted = [Op(_KINDS[type(o)], o.micro_batch_id, o.stage_id) for o in theirs]
        if tuple(converted) != ours:
            raise AssertionError(f"lowtime's 1F1B order of stage {stage} differs from ours")
        for op, inst in zip(converted, theirs, strict=True):
            ops[index[op]] = inst
    # frequency -> option index, per node row
    lookups = [
        {int(f): j for j, f in enumerate(problem.freqs[i, : problem.num_options[i]])}
        for i in range(problem.num_nodes)
    ]

    plans: list[LowtimePlan] = []
    completed = True
    solve = cpu = 0.0
    start, cstart = time.perf_counter(), time.process_time()
    solver = PhillipsDessouky(dag)
    runner = solver.run()
    solve += time.perf_counter() - start
    cpu += time.process_time() - cstart
    while True:
        start, cstart = time.perf_counter(), time.process_time()
        result = next(runner, None)
        solve += time.perf_counter() - start
        cpu += time.process_time() - cstart
        if result is None:
            break
        plan = np.fromiter(
            (lookups[i][int(op.assigned_knob)] for i, op in enumerate(ops)),
            dtype=np.uint8,
            count=len(ops),
        )
        t = float(result.quant_time * unit_time)
        plans.append(
            LowtimePlan(
                iteration=int(result.iteration),
                time=t,
                cost=float(result.cost),
                energy=float(result.cost + blocking_power * problem.dag.num_ranks * t),
                plan=plan,
            )
        )
        if time_limit is not None and solve > time_limit:
            completed = False
            break
    return LowtimeResult(solve, cpu, setup_time, tuple(plans), completed, problem)


def main(argv: list[str] | None = None) -> int:
    root = Path(__file__).resolve().parent.parent
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--profile", default=str(root / "profiles" / "gpt3-175b_a100-sxm_8stage.csv"))
    ap.add_argument("--stages", type=int, default=8)
    ap.add_argument("--microbatches", type=int, default=12)
    ap.add_argument("--blocking-power", type=float, default=83.64)
    ap.add_argument("--time-limit", type=float, default=None)
    ap.add_argument("--smoke", action="store_true", help="2 microbatches, 30 s at most (seconds)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.microbatches, args.time_limit = 2, 30.0

    res = run_lowtime(
        args.profile,
        args.stages,
        args.microbatches,
        args.blocking_power,
        time_limit=args.time_limit,
    )
    problem = res.problem
    base = problem.evaluate(problem.max_frequency_plan())
    print(
        f"profile {Path(args.profile).name}  {args.stages} stages x {args.microbatches} microbatches"
    )
    print(
        f"lowtime setup (fit + DAG) {res.setup_time:.2f} s, "
        f"solve {res.wall_time:.2f} s wall ({res.cpu_time:.2f} s CPU)"
    )
    print(f"plans: {len(res.plans)}  completed: {res.completed}")
    print(f"T0 (all max frequency): time {base.time:.4f} s  energy {base.energy:.1f} J")
    if not res.plans:
        return 1
    for label, p in (("fastest", res.fastest), ("slowest", res.plans[0])):
        true = problem.evaluate(p.plan)
        print(
            f"{label} plan (iteration {p.iteration}): lowtime estimate T={p.time:.4f} s "
            f"E={p.energy:.1f} J (cost {p.cost:.1f}); true T={true.time:.4f} s E={true.energy:.1f} J; "
            f"true T/T0 = {true.time / base.time:.5f} ({(true.time - base.time) * 1e3:+.2f} ms), "
            f"energy saved vs E0 {100 * (1 - true.energy / base.energy):.2f}%"
        )
    times, energies = problem.evaluate_many(np.stack([p.plan for p in res.plans]))
    print(f"true times span {times.min():.4f}..{times.max():.4f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
