"""The sweep's steps reuse what did not change, and give what a step from scratch gives.

Within a chunk of steps (:func:`perseus.kernels.relaxed.relaxed_chunk`), a step re-places on its
hull only the nodes whose duration moved, and takes its earliest starts from the last step's
Newton pass when the durations are that pass's own. A chunk starts from scratch, so a sweep in
chunks of one step computes everything anew at every step: the two must agree bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest

import perseus.solver.relaxation as relaxation
from benchmarks.scaling import Config, build_problem
from perseus.solver.relaxation import Relaxation, sweep_range


@pytest.mark.parametrize("profile", ["smooth", "a100"])
def test_a_sweep_in_chunks_of_one_step_is_the_same(
    profile: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Times, costs and kept durations are equal, chunk by chunk of 64 steps or of one."""
    problem = build_problem(Config(profile, 4, 16))
    rel = Relaxation.build(problem)
    whole = sweep_range(problem, rel, memory=1 << 26)
    monkeypatch.setattr(relaxation, "_STEPS_PER_CHUNK", 1)
    single = sweep_range(problem, rel, memory=1 << 26)
    assert len(whole[0]) > 100  # enough steps that a chunk of 64 reuses its state
    for a, b in zip(whole, single, strict=True):
        assert a.shape == b.shape
        assert np.array_equal(a, b)
