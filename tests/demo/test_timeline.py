"""The demo's timeline GPU (``perseus_demo.timeline``): spans, clocks, and unmetered steps.

Over a real :class:`~perseus_client.SimulatedGpu` on a virtual clock (``time_scale=0``).
"""

from __future__ import annotations

from perseus_client import SimulatedGpu
from perseus_demo.timeline import TimelineGpu

#: One stage, two clocks: (seconds, joules) per instruction.
CSV = (
    "stage,instruction,frequency,time,energy\n"
    "0,forward,1410,0.010,3.0\n0,forward,1200,0.012,2.6\n"
    "0,backward,1410,0.020,6.0\n0,backward,1200,0.024,5.2\n"
)


def _gpu() -> TimelineGpu:
    return TimelineGpu(SimulatedGpu.from_profile_csv(CSV, stage=0, time_scale=0, blocking_power=50))


def test_each_instruction_is_a_span_at_its_clock_and_an_aborted_one_is_dropped() -> None:
    gpu = _gpu()
    assert gpu.supported_clocks() == (1410, 1200)
    gpu.begin_instruction("forward", 0, None)
    gpu.end_instruction()
    gpu.set_locked_clocks(1200)
    gpu.begin_instruction("backward", 0, None)
    gpu.end_instruction()
    gpu.begin_instruction("forward", 1, None)
    gpu.abort_instruction()
    gpu.reset_locked_clocks()
    assert [s[:4] for s in gpu.spans] == [["forward", 0, None, 1410], ["backward", 0, None, 1200]]
    assert all(s[4] <= s[5] for s in gpu.spans)
    # the inner GPU ran them: 0.010 s at the top clock, 0.024 s at 1200 MHz (virtual clock)
    assert gpu.timestamp() >= 0.034 - 1e-9
    assert gpu.energy_mj() >= 3000 + 5200


def test_an_unmetered_stretch_reads_no_energy_and_the_counter_resumes_after() -> None:
    gpu = _gpu()
    gpu.begin_instruction("forward", 0, None)
    gpu.end_instruction()
    before = gpu.energy_mj()
    with gpu.unmetered():
        gpu.begin_instruction("backward", 0, None)
        gpu.end_instruction()
        assert gpu.energy_mj() == before  # what the client reads: nothing spent
        assert gpu.inner.energy_mj() >= before + 6000  # the GPU did spend it
    assert gpu.energy_mj() == gpu.inner.energy_mj() >= before + 6000
