"""``perseus_common.gpus``: the one table of GPUs with a measured blocking power."""

from __future__ import annotations

import pytest

from perseus_common.gpus import KNOWN_GPUS, known_gpu_for


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("gpt3-175b_a100-sxm_8stage.csv", "a100"),
        ("gpt3-175b_a40_8stage.csv", "a40"),
        ("A100.csv", "a100"),
        ("ma400.csv", None),
        ("a1000.csv", None),
        ("profile.csv", None),
        ("a40_vs_a100.csv", None),
    ],
)
def test_known_gpu_for_a_profile_name(name: str, key: str | None) -> None:
    gpu = known_gpu_for(name)
    assert (gpu.key if gpu else None) == key


def test_the_table_holds_the_measured_blocking_powers() -> None:
    assert {g.key: g.blocking_power for g in KNOWN_GPUS} == {"a100": 83.64, "a40": 70.38}


def test_each_gpu_has_its_power_limit_above_its_blocking_power() -> None:
    assert {g.key: g.max_power_limit for g in KNOWN_GPUS} == {"a100": 400.0, "a40": 300.0}
    assert all(0 < g.blocking_power < g.max_power_limit for g in KNOWN_GPUS)
    assert len({g.key for g in KNOWN_GPUS}) == len(KNOWN_GPUS)
