"""Plan selection: which frontier point each data-parallel pipeline runs, and why.

The deployed state of a job is one frontier index per data-parallel pipeline. By default every
pipeline runs the plan its *policy* selects (after a solve: the fastest plan, point 0). When
pipelines straggle, the others move to the least-energy plan that still finishes within the
straggler's observed iteration time T' (they would wait for it at the gradient sync anyway);
the stragglers keep the policy plan. A pipeline with a slow stage whose frontier was re-solved
(``resolved``) runs the fastest plan of its own frontier, and its time is the T' of the others;
when another straggler is slower still, it too follows the slowest: the least-energy plan of its
own frontier within that T' (its own frontier describes it; a straggler without one keeps the
policy plan, for how a slower plan would run on it is not known).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from perseus.errors import InfeasibleError, OptionError
from perseus.frontier import Frontier
from perseus.policies import POLICIES, Policy, resolve
from perseus_server.domain.states import StragglerSource

__all__ = ["PlanPolicy", "PipelinePlan", "PlanDecision", "Straggler", "decide", "resolve_policy"]


@dataclass(frozen=True)
class PlanPolicy:
    """How the default plan is chosen.

    ``kind``, a policy of :data:`perseus.policies.POLICIES` (``index``, ``deadline``,
    ``slowdown``, ...) and ``value`` its main parameter. The default, ``index 0``, is the
    fastest plan. ``copies``: the job's ``data_parallel x tensor_parallel`` copies of one
    pipeline (for ``power_budget``, watts of the whole job). ``options``: the policy's further
    parameters (``eta``'s ``max_power``), as resolved when the policy was set. ``swing``:
    the swing bounds the deployed plan's power floors keep (``max_swing``, ``max_ramp``,
    ``ramp_window``; empty: none, no floors).
    """

    kind: str = "index"
    value: float = 0.0
    copies: int = 1
    options: tuple[tuple[str, float], ...] = field(default=(), kw_only=True)
    swing: tuple[tuple[str, float], ...] = field(default=(), kw_only=True)

    def to_json(self) -> dict[str, Any]:
        """The policy as stored: kind, value, options and any swing bounds."""
        doc: dict[str, Any] = {"kind": self.kind, "value": self.value}
        spec = POLICIES.get(self.kind)
        if spec is not None and any(p.name == "copies" for p in spec.options):
            doc["copies"] = self.copies
        doc.update(self.options)
        if self.swing:
            doc["swing"] = dict(self.swing)
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any] | None) -> PlanPolicy:
        """Read :meth:`to_json`'s document (empty or None: the default policy)."""
        if not doc:
            return cls()
        kind = str(doc["kind"])
        names = {p.name for p in POLICIES[kind].options if p.public} if kind in POLICIES else set()
        options = tuple((k, float(v)) for k, v in doc.items() if k in names)
        swing = tuple((str(k), float(v)) for k, v in (doc.get("swing") or {}).items())
        return cls(
            kind, float(doc["value"]), int(doc.get("copies", 1)), options=options, swing=swing
        )

    def _spec(self) -> Policy:
        policy = POLICIES.get(self.kind)
        if policy is None:
            raise InfeasibleError(f"unknown plan policy {self.kind!r}")
        return policy

    def describe(self) -> str:
        """The policy in words, as its registry entry describes it (and its swing bounds)."""
        text = self._spec().describe(self.value, dict(self.options))
        if self.swing:
            text += " with power floors (" + ", ".join(f"{k} {v:g}" for k, v in self.swing) + ")"
        return text


@dataclass(frozen=True)
class Straggler:
    """A pipeline known to be slow: its observed iteration time (s) and where that came from.

    For a slow stage, also which stages and by how much (``detail``).
    """

    pipeline: int
    time: float
    source: StragglerSource
    detail: str = ""


@dataclass(frozen=True)
class PipelinePlan:
    """The frontier point a pipeline runs and the reason it was chosen.

    ``own``: the index is into the pipeline's own re-solved frontier rather than the job's.
    """

    index: int
    reason: str
    own: bool = False


@dataclass(frozen=True)
class PlanDecision:
    """The plan of every pipeline, and why it was chosen."""

    plans: tuple[PipelinePlan, ...]
    reason: str

    def indices(self) -> list[int]:
        """Each pipeline's frontier index."""
        return [p.index for p in self.plans]


def resolve_policy(frontier: Frontier, policy: PlanPolicy) -> int:
    """The frontier index the policy selects.

    Raises :class:`InfeasibleError` when none fits, also for a value out of bounds (then with
    the ``field`` it names), so that a caller that falls back to the default plan on an
    infeasible policy does so for any policy it cannot resolve (an unknown kind, as a stored
    policy of another version may have).
    """
    policy._spec()
    try:
        return resolve(
            frontier, policy.kind, policy.value, {"copies": policy.copies, **dict(policy.options)}
        )
    except OptionError as e:
        err = InfeasibleError(str(e))
        err.field = e.field  # type: ignore[attr-defined]
        raise err from None


def decide(
    frontier: Frontier,
    policy: PlanPolicy,
    pipelines: int,
    stragglers: Mapping[int, Straggler] | None = None,
    overrides: Mapping[int, int] | None = None,
    resolved: Mapping[int, tuple[Frontier, str]] | None = None,
) -> PlanDecision:
    """One plan per data-parallel pipeline.

    Args:
        frontier: the job's frontier.
        policy: the default plan's policy.
        pipelines: number of data-parallel pipelines.
        stragglers: slow pipelines by index (their time T' drives the others' plans).
        overrides: pipelines pinned to an explicit index (``PUT /plan`` with ``pipelines``).
        resolved: pipelines with a slow stage: their re-solved frontier and a description of the
            slowdown; they run its fastest plan (point 0), whose time is their T', or, when a
            straggler is slower, its least-energy plan within the slowest T'.

    The others get the plan that uses the least energy over an iteration of T' seconds, waiting
    included (``Frontier.index_for_deadline(T', wait=True)``): they wait for the straggler at
    the gradient sync anyway.
    """
    base = resolve_policy(frontier, policy)
    base_reason = f"default: {policy.describe()}"
    stragglers = dict(stragglers or {})
    overrides = dict(overrides or {})
    resolved = dict(resolved or {})
    for p, (own, why) in resolved.items():
        stragglers[p] = Straggler(p, float(own.times[0]), StragglerSource.SLOW_STAGE, why)
    if not stragglers:
        plans = tuple(
            PipelinePlan(overrides[p], f"selected: frontier point {overrides[p]}")
            if p in overrides
            else PipelinePlan(base, base_reason)
            for p in range(pipelines)
        )
        return PlanDecision(plans, base_reason if not overrides else "selected per pipeline")
    slowest = max(stragglers.values(), key=lambda s: s.time)
    t_prime = slowest.time
    try:
        slow_index = frontier.index_for_deadline(t_prime, wait=True)
    except InfeasibleError:
        slow_index = base
    slow_index = max(slow_index, base)
    out = []
    for p in range(pipelines):
        if p in resolved:
            out.append(_resolved_plan(*resolved[p], slowest))
        elif p in stragglers:
            s = stragglers[p]
            out.append(
                PipelinePlan(
                    base,
                    f"straggler ({s.source}, {s.time:.4g} s per iteration): keeps the {policy.describe()}",
                )
            )
        elif p in overrides:
            out.append(PipelinePlan(overrides[p], f"selected: frontier point {overrides[p]}"))
        else:
            out.append(
                PipelinePlan(
                    slow_index,
                    f"slowed to match straggler pipeline {slowest.pipeline} (T'={t_prime:.4g} s, "
                    f"plan takes {frontier.times[slow_index]:.4g} s)",
                )
            )
    names = ", ".join(str(p) for p in sorted(stragglers))
    return PlanDecision(
        tuple(out), f"straggler pipeline(s) {names}; others slowed to T'={t_prime:.4g} s"
    )


def _resolved_plan(own: Frontier, why: str, slowest: Straggler) -> PipelinePlan:
    """The plan of a pipeline with a re-solved frontier ``own``, given the ``slowest`` straggler.

    Its fastest plan when it is the slowest; else the least-energy plan of ``own`` within the
    slowest's T' (waiting included), as the pipelines without a straggler are given on the
    job's frontier.
    """
    fastest = float(own.times[0])
    index = 0
    if slowest.time > fastest:
        try:
            index = own.index_for_deadline(slowest.time, wait=True)
        except InfeasibleError:
            index = 0
    if index == 0:
        return PipelinePlan(
            0,
            f"slow stage ({why}): runs the fastest plan of its re-solved frontier "
            f"({fastest:.4g} s per iteration)",
            own=True,
        )
    return PipelinePlan(
        index,
        f"slow stage ({why}): slowed on its re-solved frontier to match straggler pipeline "
        f"{slowest.pipeline} (T'={slowest.time:.4g} s, plan takes {float(own.times[index]):.4g} s)",
        own=True,
    )
