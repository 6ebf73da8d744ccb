"""Plan queries and plan policies: the frontier point a policy selects, as a JSON document.

Everything about a plan query is here: a request's fields read into a policy once
(:func:`requested_policy`, :func:`deployed_policy`), completed with what the job supplies
(:func:`shape_policy`), resolved against the frontier (:func:`~perseus_server.decisions.planner.resolve_policy`,
its failures as 422s: :func:`policy_error`), and the answer's bytes kept per (job, query) while
what they were built from stays (:class:`PlanAnswers`, owned by :class:`PlanQueries`).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Hashable, Mapping
from dataclasses import replace
from typing import Any

from perseus.errors import InfeasibleError, OptionError
from perseus.policies import CRITERIA_FIRST, POLICIES, POLICY_NAMES, chosen
from perseus.power import PowerBudgetError, SwingBounds
from perseus_common.gpus import known_gpu_for
from perseus_server.decisions.planner import PlanPolicy, resolve_policy
from perseus_server.domain.errors import BadRequest
from perseus_server.service.context import ServiceContext
from perseus_server.service.deployment import require_frontier
from perseus_server.service.plan_powers import PlanPowers
from perseus_server.service.state import Job
from perseus_server.service.swing import SWING_FIELDS, swing_bounds, swing_doc, swing_items

__all__ = [
    "PlanAnswers",
    "PlanQueries",
    "deployed_policy",
    "job_max_power",
    "plan_doc",
    "policy_error",
    "requested_policy",
    "shape_policy",
]


def requested_policy(given: Mapping[str, Any]) -> PlanPolicy:
    """The plan policy among a request's fields (none: the fastest plan).

    A 422 naming the field for two policies, an option without its policy or a value out of
    bounds (:func:`perseus.policies.chosen`).
    """
    try:
        found = chosen(given)
    except OptionError as e:
        raise BadRequest(str(e), field=e.field) from None
    if found is None:
        return PlanPolicy()
    name, value, options = found
    return PlanPolicy(name, value, options=tuple(sorted(options.items())))


def deployed_policy(given: Mapping[str, Any], pipelines: list[int] | None) -> PlanPolicy:
    """The policy of a ``PUT /jobs/{id}/plan`` body's fields, with its swing bounds.

    Swing bounds are the whole job's: a 422 naming ``max_swing`` with ``pipelines``.
    """
    fields = dict(given)
    swing = swing_bounds({k: fields.pop(k, None) for k in SWING_FIELDS})
    policy = requested_policy(fields)
    if swing is None:
        return policy
    if pipelines is not None:
        raise BadRequest("swing bounds are the whole job's: give no pipelines", field="max_swing")
    return replace(policy, swing=swing_items(swing))


def policy_error(e: InfeasibleError | OptionError, policy: PlanPolicy) -> BadRequest:
    """The 422 of a policy no plan meets (or a value out of bounds: the field it names).

    A power budget's names the lowest achievable power.
    """
    if isinstance(e, PowerBudgetError):
        return BadRequest(str(e), field=policy.kind, lowest_power=e.lowest_power)
    return BadRequest(str(e), field=getattr(e, "field", None) or policy.kind)


def job_max_power(job: Job) -> tuple[float, str] | None:
    """One GPU's maximum power limit (W) for the cost policy's ``MAXPOWER``, and where it came from.

    The mean of what the job's ranks registered (NVML's power-limit constraints), else the
    known-GPU table (:data:`perseus_common.gpus.KNOWN_GPUS`) for the ranks' GPU name or the
    job's ``gpu_model``; ``None`` when none of these tells.
    """
    ranks = list(job.ranks.by_global.values())
    limits = [r.max_power_limit_w for r in ranks if r.max_power_limit_w > 0]
    if limits:
        return sum(limits) / len(limits), "the ranks' power-limit constraints"
    for name in [r.gpu_name for r in ranks] + [job.spec.gpu_model]:
        gpu = known_gpu_for(name) if name else None
        if gpu is not None:
            return gpu.max_power_limit, f"the {gpu.name}'s maximum power limit"
    return None


def shape_policy(job: Job, policy: PlanPolicy) -> PlanPolicy:
    """``policy`` with what the job supplies.

    Its pipeline copies (``power_budget``: watts of the whole job) and, for the cost policy
    (``eta``) without a ``max_power``, the job's (:func:`job_max_power`); a 422 naming
    ``max_power`` when the job has none.
    """
    options = dict(policy.options)
    if policy.kind == "eta" and "max_power" not in options:
        found = job_max_power(job)
        if found is None:
            raise BadRequest(
                "the cost policy (eta) needs MAXPOWER and this job has none: give max_power "
                "(W, one GPU's maximum power limit), register ranks whose GPUs report their "
                "power-limit constraints, or set the job's gpu_model to a known GPU",
                field="max_power",
            )
        options["max_power"] = found[0]
    spec = job.spec
    copies = POLICIES.get(policy.kind)
    return replace(
        policy,
        copies=spec.data_parallel * spec.tensor_parallel
        if copies is not None and any(p.name == "copies" for p in copies.options)
        else policy.copies,
        options=tuple(sorted(options.items())),
    )


def plan_doc(
    job: Job, index: int, *, steps: bool, powers: PlanPowers | None = None
) -> dict[str, Any]:
    """Frontier point ``index`` of ``job``: its time, energy, bound, savings and frequencies.

    ``partial`` when the job's frontier is only a first plan (the answer is from what exists).
    """
    f = job.frontier.current
    assert f is not None
    plan = job.frontier.steps(index)
    doc: dict[str, Any] = {
        "index": index,
        "time": float(f.times[index]),
        "energy": float(f.energies[index]),
        "lower_bound": float(f.lower_bounds[index]),
        "max_frequency_time": f.max_frequency_time,
        "max_frequency_energy": f.max_frequency_energy,
        "slowdown": float(f.times[index]) / f.max_frequency_time - 1.0,
        "energy_savings": 1.0 - float(f.energies[index]) / f.max_frequency_energy,
        "frequencies": [[s["frequency"] for s in rank] for rank in plan],
    }
    if powers is not None:
        doc.update(powers.point(job, index))
    if job.frontier.row.partial:
        doc["partial"] = True
    if steps:
        doc["steps"] = plan
    return doc


#: Cached answers per job, and in all, and their bytes in all (a caller varying the query
#: evicts the oldest; an answer larger than the byte bound is not kept).
ANSWERS_PER_JOB = 256
ANSWERS_TOTAL = 4096
ANSWERS_BYTES = 128 * 1024 * 1024


def _basis(job: Job) -> tuple[Any, ...]:
    """What a job's plan answers are built from.

    The job, its frontier (a solve sets a new one), its profile (the peak powers; a new profile
    is a new object) and whether the frontier is partial. An answer is served only while each is
    the same (``is``, not ``==``).
    """
    return (job, job.frontier.current, job.profile.current, job.frontier.row.partial)


def _same(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return all(x is y for x, y in zip(a, b, strict=True))


class PlanAnswers:
    """Encoded ``GET /jobs/{id}/plan`` answers per (job, query), least recently used evicted first.

    At most ``per_job`` per job, ``total`` and ``total_bytes`` in all, least recently used
    evicted first. A job's answers are dropped when its basis (:func:`_basis`) changed, and on
    :meth:`forget` (the job deleted). The caller runs the authorization before asking (the REST
    gate runs before the route).
    """

    def __init__(
        self,
        per_job: int = ANSWERS_PER_JOB,
        total: int = ANSWERS_TOTAL,
        total_bytes: int = ANSWERS_BYTES,
    ) -> None:
        self.per_job, self.total, self.total_bytes = per_job, total, total_bytes
        self._jobs: OrderedDict[str, tuple[tuple[Any, ...], OrderedDict[Hashable, bytes]]] = (
            OrderedDict()
        )
        self._count = self.bytes = 0

    def __len__(self) -> int:
        return self._count

    def get(self, job: Job, query: Hashable) -> bytes | None:
        """The answer kept for ``query`` while its basis holds; None otherwise.

        A job whose basis changed has its answers dropped here.
        """
        entry = self._jobs.get(job.id)
        if entry is None:
            return None
        if not _same(entry[0], _basis(job)):
            self.forget(job.id)
            return None
        body = entry[1].get(query)
        if body is not None:
            self._jobs.move_to_end(job.id)
            entry[1].move_to_end(query)
        return body

    def put(self, job: Job, query: Hashable, body: bytes) -> None:
        """Keep ``body`` as the answer to ``query``; the least recently used are evicted.

        A body larger than ``total_bytes`` is not kept.
        """
        if len(body) > self.total_bytes:
            return
        basis = _basis(job)
        entry = self._jobs.get(job.id)
        if entry is None or not _same(entry[0], basis):
            self.forget(job.id)
            entry = self._jobs[job.id] = (basis, OrderedDict())
        answers = entry[1]
        old = answers.pop(query, None)
        if old is not None:
            self._count, self.bytes = self._count - 1, self.bytes - len(old)
        answers[query] = body
        self._count, self.bytes = self._count + 1, self.bytes + len(body)
        self._jobs.move_to_end(job.id)
        if len(answers) > self.per_job:
            self._drop(answers)
        while self._count > self.total or self.bytes > self.total_bytes:
            oldest_id, (_, oldest) = next(iter(self._jobs.items()))
            self._drop(oldest)
            if not oldest:
                del self._jobs[oldest_id]

    def _drop(self, answers: OrderedDict[Hashable, bytes]) -> None:
        """Drops the least recently used of ``answers``."""
        body = answers.popitem(last=False)[1]
        self._count, self.bytes = self._count - 1, self.bytes - len(body)

    def forget(self, job_id: str) -> None:
        """Drop the job's answers (the job was deleted)."""
        entry = self._jobs.pop(job_id, None)
        if entry is not None:
            self._count -= len(entry[1])
            self.bytes -= sum(len(b) for b in entry[1].values())


def _keeps(policy: PlanPolicy) -> bool:
    """Whether an answer under ``policy`` may be kept.

    Not the cost policy without its ``max_power``: the job's comes from its ranks, which
    register at any time.
    """
    return not (policy.kind == "eta" and all(k != "max_power" for k, _ in policy.options))


class PlanQueries:
    """``GET /jobs/{id}/plan``: the plan a policy selects, its bytes kept (:class:`PlanAnswers`)."""

    def __init__(
        self,
        ctx: ServiceContext,
        powers: PlanPowers | None = None,
        answers: PlanAnswers | None = None,
    ) -> None:
        self.ctx = ctx
        self.powers = powers
        self.answers = answers if answers is not None else PlanAnswers()

    def cached(self, job_id: str, query: Hashable) -> bytes | None:
        """The answer :meth:`query` kept for ``query``, while it still stands; None when none.

        It stands while the job's frontier and profile are still the ones it was built from;
        None also when there is no such job. The caller has authorized the request.
        """
        job = self.ctx.jobs.find(job_id)
        return None if job is None else self.answers.get(job, query)

    def forget(self, job_id: str) -> None:
        """Drop the job's kept answers (the job was deleted)."""
        self.answers.forget(job_id)

    def deployment_policy(
        self, job_id: str, given: Mapping[str, Any], pipelines: list[int] | None
    ) -> PlanPolicy:
        """The policy a ``PUT /jobs/{id}/plan`` body deploys, with what the job supplies.

        Read from the body's fields first (:func:`deployed_policy`: a bad field is named
        before an unknown job), then shaped for the job (:func:`shape_policy`).
        """
        policy = deployed_policy(given, pipelines)
        return shape_policy(self.ctx.jobs.get(job_id), policy)

    def query(
        self,
        job_id: str,
        given: Mapping[str, Any],
        *,
        steps: bool = False,
        query: Hashable = None,
        swing: SwingBounds | None = None,
    ) -> bytes:
        """The plan the policy among ``given`` selects, as a JSON document (bytes).

        Exactly one policy must be given (422 otherwise). Kept for :meth:`cached` under
        ``query`` when given (:func:`_keeps`). With ``swing``, the plan and power floors of
        least energy within the policy's deadline that meet the bounds
        (:mod:`perseus_server.service.swing`).
        """
        policy = requested_policy(given)
        if all(given.get(name) is None for name in POLICY_NAMES):
            raise BadRequest(f"give one of {', '.join(CRITERIA_FIRST)}", field=CRITERIA_FIRST[0])
        job = self.ctx.jobs.get(job_id)
        shaped = shape_policy(job, policy)
        body = self._answer(job, shaped, steps, swing)
        if query is not None and _keeps(policy):
            self.answers.put(job, query, body)
        return body

    def _answer(
        self, job: Job, policy: PlanPolicy, steps: bool, swing: SwingBounds | None
    ) -> bytes:
        """The document of the frontier point ``policy`` (shaped) selects, encoded."""
        frontier = require_frontier(job)
        try:
            index = resolve_policy(frontier, policy)
        except (InfeasibleError, OptionError) as e:
            raise policy_error(e, policy) from None
        doc = plan_doc(job, index, steps=steps, powers=self.powers)
        if swing is not None:
            problem = None if self.powers is None else self.powers.of(job).problem
            extra = swing_doc(job, frontier, index, policy, swing, problem)
            if extra["index"] != index or not extra["plan_is_frontier_point"]:
                doc.pop("steps", None)  # the steps are the frontier point's; the plan differs
            doc.update(extra)
        return json.dumps(doc).encode()
