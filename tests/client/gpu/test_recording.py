"""``perseus_client.gpu.recording``: a wrapper that records every clock request and instruction.

What the clock tests and the demo read back: the requests in order, each instruction with the
clock it ran at, and the same in a JSON-lines log.
"""

from __future__ import annotations

from pathlib import Path

from client_data import PROFILE

from perseus_client import RecordingGpu, SimulatedGpu, read_log


def test_recording_gpu_records_requests_and_instruction_clocks(tmp_path, sim_gpu):
    log = tmp_path / "rec.jsonl"
    gpu = RecordingGpu(sim_gpu, log_path=log)
    gpu.set_locked_clocks(1200)
    gpu.begin_instruction("forward", 3, 0)
    gpu.end_instruction()
    gpu.reset_locked_clocks()
    gpu.begin_instruction("backward", 3, None)
    gpu.end_instruction()
    assert [(r.op, r.mhz) for r in gpu.requests] == [("set", 1200), ("reset", None)]
    assert [(i.kind, i.microbatch, i.stage, i.mhz) for i in gpu.instructions] == [
        ("forward", 3, 0, 1200),
        ("backward", 3, None, None),
    ]
    gpu.close()
    requests, instructions = read_log(log)
    assert requests == gpu.requests and instructions == gpu.instructions
    assert sim_gpu.locked_clock is None


def test_everything_else_is_the_inner_gpus(tmp_path: Path) -> None:
    inner = SimulatedGpu(PROFILE, stage=0, blocking_power=50.0, time_scale=0.0)
    gpu = RecordingGpu(inner)  # no log: only in memory
    assert gpu.identity() == inner.identity()
    assert gpu.supported_clocks() == inner.supported_clocks()
    gpu.set_locked_clocks(1200)
    assert gpu.locked_clock == 1200 == inner.locked_clock
    gpu.begin_instruction("forward", 0, 0)
    assert gpu.running_instruction() == ("forward", 0, 0)
    gpu.abort_instruction()  # recorded as it began, with the clock locked then
    assert gpu.running_instruction() is None
    assert [(i.kind, i.mhz) for i in gpu.instructions] == [("forward", 1200)]
    assert gpu.energy_mj() == inner.energy_mj() and gpu.timestamp() == inner.timestamp()
    gpu.close()


def test_a_log_with_blank_lines_reads_back(tmp_path: Path) -> None:
    log = tmp_path / "rec.jsonl"
    log.write_text(
        '{"event": "set", "mhz": 1005}\n\n'
        '{"event": "instruction", "kind": "backward", "microbatch": 2, "stage": 1, "mhz": 1005}\n'
        '{"event": "reset", "mhz": null}\n'
    )
    requests, instructions = read_log(log)
    assert [(r.op, r.mhz) for r in requests] == [("set", 1005), ("reset", None)]
    assert [(i.kind, i.microbatch, i.stage, i.mhz) for i in instructions] == [
        ("backward", 2, 1, 1005)
    ]
