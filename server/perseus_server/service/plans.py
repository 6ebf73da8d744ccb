"""Plan queries: the frontier point a policy selects, as a JSON document.

Its bytes are cached per (job, query) while what they were built from stays (:class:`PlanAnswers`).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import replace
from typing import Any

from perseus.errors import InfeasibleError, OptionError
from perseus.policies import POLICIES
from perseus.power import PowerBudgetError, SwingBounds
from perseus_common.gpus import known_gpu_for
from perseus_server.decisions.planner import PlanPolicy, resolve_policy
from perseus_server.domain.errors import BadRequest
from perseus_server.service.context import ServiceContext
from perseus_server.service.deployment import require_frontier
from perseus_server.service.power import PlanPowers
from perseus_server.service.state import Job
from perseus_server.service.swing import swing_doc

__all__ = [
    "PlanAnswers",
    "PlanQueries",
    "job_max_power",
    "plan_doc",
    "policy_error",
    "shape_policy",
]


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


class PlanQueries:
    """``GET /jobs/{id}/plan``."""

    def __init__(self, ctx: ServiceContext, powers: PlanPowers | None = None) -> None:
        self.ctx = ctx
        self.powers = powers

    def query(
        self,
        job_id: str,
        policy: PlanPolicy,
        *,
        steps: bool = False,
        swing: SwingBounds | None = None,
    ) -> bytes:
        """The plan ``policy`` selects as a JSON document (bytes).

        With ``swing``, the plan and power floors of least energy within the policy's deadline
        that meet the bounds (:mod:`perseus_server.service.swing`).
        """
        job = self.ctx.jobs.get(job_id)
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
