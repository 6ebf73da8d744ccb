"""Job descriptions: what a training job looks like to the scheduler, validated against limits."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from perseus.errors import ScheduleError
from perseus.schedules import Schedule, make_schedule
from perseus_common.kinds import INSTRUCTION_KINDS
from perseus_server.config import Limits
from perseus_server.domain.errors import BadRequest

__all__ = ["JobSpec", "RankInfo"]


@dataclass(frozen=True)
class JobSpec:
    """One training job: ``data_parallel`` pipelines of ``stages`` ranks running ``schedule``.

    Each rank is ``tensor_parallel`` GPUs wide; the schedule runs ``microbatches`` microbatches
    per iteration.

    ``orders`` is set only for explicit per-rank schedules (``schedule == "custom"``).
    """

    stages: int
    microbatches: int
    schedule: str = "1f1b"
    virtual_stages: int = 1
    orders: tuple[tuple[tuple[str, int, int], ...], ...] | None = None
    data_parallel: int = 1
    tensor_parallel: int = 1
    gpu_model: str = ""
    blocking_power: float = 0.0
    name: str = ""

    @property
    def world_size(self) -> int:
        """The number of ranks the job expects: stages x data parallel x tensor parallel."""
        return self.stages * self.data_parallel * self.tensor_parallel

    def build_schedule(self) -> Schedule:
        """The pipeline schedule; raises :class:`BadRequest` naming the field on any problem."""
        try:
            if self.orders is not None:
                sched = Schedule.from_json(
                    {"name": self.schedule, "orders": [[list(op) for op in o] for o in self.orders]}
                )
            else:
                sched = make_schedule(
                    self.schedule, self.stages, self.microbatches, self.virtual_stages
                )
        except ScheduleError as e:
            field = "schedule.orders" if self.orders is not None else "schedule"
            raise BadRequest(str(e), field=field) from None
        if self.orders is not None:
            if sched.ranks != self.stages:
                raise BadRequest(
                    f"the explicit order has {sched.ranks} ranks but the job has stages={self.stages}",
                    field="schedule.orders",
                )
            if sched.microbatches != self.microbatches:
                raise BadRequest(
                    f"the explicit order runs {sched.microbatches} microbatches but the job has microbatches={self.microbatches}",
                    field="schedule.orders",
                )
        return sched

    def validate(self, limits: Limits) -> Schedule:
        """Check every bound (see :class:`Limits`) and return the built schedule."""
        bounds = {
            "stages": (self.stages, limits.max_stages),
            "microbatches": (self.microbatches, limits.max_microbatches),
            "schedule.virtual_stages": (self.virtual_stages, limits.max_virtual_stages),
            "data_parallel": (self.data_parallel, limits.max_data_parallel),
            "tensor_parallel": (self.tensor_parallel, limits.max_tensor_parallel),
        }
        for name, (value, hi) in bounds.items():
            if not (1 <= value <= hi):
                raise BadRequest(f"must be between 1 and {hi}, got {value}", field=name)
        if self.world_size > limits.max_ranks:
            raise BadRequest(
                f"stages * data_parallel * tensor_parallel = {self.world_size} exceeds {limits.max_ranks} ranks",
                field="data_parallel",
            )
        if not (math.isfinite(self.blocking_power) and 0 <= self.blocking_power <= 10_000):
            raise BadRequest(
                f"must be a number of watts in [0, 10000], got {self.blocking_power!r}",
                field="blocking_power",
            )
        if self.orders is not None:
            self._check_orders(limits)
        elif self.stages * self.microbatches * 2 * self.virtual_stages > limits.max_instructions:
            raise BadRequest(
                f"stages * microbatches * 2 * virtual_stages exceeds {limits.max_instructions} instructions",
                field="microbatches",
            )
        return self.build_schedule()

    def _check_orders(self, limits: Limits) -> None:
        """Bound an explicit order by the job's own numbers before anything is allocated.

        Linear in the order's length: every microbatch must be below ``microbatches``, every
        model stage below ``stages * max_virtual_stages``, so a short request naming a huge stage
        or microbatch number is refused instead of sizing the schedule by it.
        """
        assert self.orders is not None
        total = sum(len(o) for o in self.orders)
        if total > limits.max_instructions:
            raise BadRequest(
                f"at most {limits.max_instructions} instructions, got {total}",
                field="schedule.orders",
            )
        if len(self.orders) != self.stages:
            raise BadRequest(
                f"the explicit order has {len(self.orders)} ranks but the job has "
                f"stages={self.stages}",
                field="schedule.orders",
            )
        max_stage = self.stages * limits.max_virtual_stages
        for r, order in enumerate(self.orders):
            for i, (kind, mb, stage) in enumerate(order):
                if kind not in INSTRUCTION_KINDS:
                    raise BadRequest(
                        f"orders[{r}][{i}]: unknown instruction {kind[:64]!r}",
                        field="schedule.orders",
                    )
                if not 0 <= mb < self.microbatches:
                    raise BadRequest(
                        f"orders[{r}][{i}]: microbatch must be between 0 and "
                        f"{self.microbatches - 1}, got {mb}",
                        field="schedule.orders",
                    )
                if not 0 <= stage < max_stage:
                    raise BadRequest(
                        f"orders[{r}][{i}]: model stage must be between 0 and {max_stage - 1} "
                        f"(stages * max_virtual_stages), got {stage}",
                        field="schedule.orders",
                    )

    def to_json(self) -> dict[str, Any]:
        """The job as stored: its fields, a custom schedule's orders included."""
        sched: dict[str, Any] = {"name": self.schedule}
        if self.orders is not None:
            sched["orders"] = [[list(op) for op in o] for o in self.orders]
        else:
            sched["virtual_stages"] = self.virtual_stages
        return {
            "name": self.name,
            "stages": self.stages,
            "microbatches": self.microbatches,
            "schedule": sched,
            "data_parallel": self.data_parallel,
            "tensor_parallel": self.tensor_parallel,
            "gpu_model": self.gpu_model,
            "blocking_power": self.blocking_power,
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> JobSpec:
        """Read :meth:`to_json`'s document."""
        sched = doc.get("schedule", {})
        orders = sched.get("orders")
        return cls(
            stages=int(doc["stages"]),
            microbatches=int(doc["microbatches"]),
            schedule=str(sched.get("name", "1f1b")),
            virtual_stages=int(sched.get("virtual_stages", 1)),
            orders=None
            if orders is None
            else tuple(tuple((str(k), int(m), int(s)) for k, m, s in o) for o in orders),
            data_parallel=int(doc.get("data_parallel", 1)),
            tensor_parallel=int(doc.get("tensor_parallel", 1)),
            gpu_model=str(doc.get("gpu_model", "")),
            blocking_power=float(doc.get("blocking_power", 0.0)),
            name=str(doc.get("name", "")),
        )


@dataclass(frozen=True)
class RankInfo:
    """A registered training rank, as it registers.

    ``max_power_limit_w``: its GPU's maximum power limit (W, NVML's power-limit constraints; 0:
    the rank did not tell). Its JSON (the status, the store) keeps the key ``max_power_limit``.
    """

    job_id: str
    rank_id: str
    global_rank: int
    pipeline_rank: int
    data_rank: int
    tensor_rank: int
    gpu_name: str
    supported_clocks: tuple[int, ...]
    hostname: str
    max_power_limit_w: float = 0.0

    def to_json(self) -> dict[str, Any]:
        """The rank as stored and shown in the status."""
        return {
            "rank_id": self.rank_id,
            "global_rank": self.global_rank,
            "pipeline_rank": self.pipeline_rank,
            "data_rank": self.data_rank,
            "tensor_rank": self.tensor_rank,
            "gpu_name": self.gpu_name,
            "supported_clocks_mhz": list(self.supported_clocks),
            "hostname": self.hostname,
            "max_power_limit": self.max_power_limit_w,
        }
