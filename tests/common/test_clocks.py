"""``perseus_common.clocks``: the SM clock bound and NVML's clock-event reason names."""

from __future__ import annotations

import pytest

from perseus_common.clocks import (
    CLOCK_EVENT_REASON_NAMES,
    CLOCK_EVENT_REASONS,
    MAX_CLOCK_MHZ,
    reason_mask,
    reason_names,
)


def test_a_mask_names_its_bits_lowest_first() -> None:
    assert reason_names(0) == ()
    assert reason_names(0x4 | 0x40) == ("sw_power_cap", "hw_thermal_slowdown")
    assert reason_names(0x1 | 0x200) == ("gpu_idle", "0x200")  # a bit without a name


@pytest.mark.parametrize("mask", [0, 0x1, 0x44, 0x1FF, 0x1FF | 0x400, 0x8000])
def test_names_give_back_the_mask(mask: int) -> None:
    assert reason_mask(reason_names(mask)) == mask


def test_a_name_neither_known_nor_hex_has_no_bit() -> None:
    assert reason_mask(["sw_power_cap", "solar_flare", "0xzz"]) == 0x4
    assert reason_mask([]) == 0


def test_one_bit_per_name_and_a_bound_far_above_any_gpu() -> None:
    bits = list(CLOCK_EVENT_REASONS)
    assert all(b & (b - 1) == 0 for b in bits)  # each a single bit
    assert len(CLOCK_EVENT_REASON_NAMES) == len(bits)
    assert 10_000 < MAX_CLOCK_MHZ < 2**31 - 1
