"""Unit tests of the DeepSpeed integration that need no process group.

The order derived from ``TrainSchedule`` and argument checking (the hooks themselves run in
``test_deepspeed_e2e.py``).
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("DS_ACCELERATOR", "cpu")
pytest.importorskip("deepspeed")

from perseus.schedules import Schedule, one_f_one_b  # noqa: E402
from perseus_client.integrations import deepspeed as perseus_ds  # noqa: E402


@pytest.mark.parametrize("stages", [1, 2, 3, 4])
@pytest.mark.parametrize("micro_batches", [1, 2, 3, 4, 8])
def test_train_schedule_is_1f1b(stages: int, micro_batches: int) -> None:
    orders = perseus_ds.export_orders(micro_batches, stages)
    assert orders == one_f_one_b(stages, micro_batches).to_json()["orders"]
    Schedule.from_orders(orders)


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="stage_id"):
        perseus_ds.stage_order(4, 2, 2)
    with pytest.raises(ValueError, match="micro_batches"):
        perseus_ds.export_orders(0, 2)
    with pytest.raises(TypeError, match="engine"):
        perseus_ds.instrument(object(), _Client())
    with pytest.raises(TypeError, match="client"):
        perseus_ds.instrument(object(), object())  # type: ignore[arg-type]


class _Client:
    def iteration(self) -> None: ...
    def instruction(self, kind: str, *, microbatch: int, stage: int) -> None: ...
