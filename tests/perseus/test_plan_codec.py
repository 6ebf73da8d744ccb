"""The compact plan encodings (:mod:`perseus.plan_codec`).

Exact round trips of the stored and the per-rank forms (narrow and wide clock tables), the old forms
still read, the ``--plans`` document a small fraction of the old one's size, and the frontier's JSON
built on them.
"""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

import perseus
from perseus.frontier import Frontier
from perseus.plan_codec import (
    decode_rank_plans,
    decode_rows,
    encode_rank_plans,
    encode_rows,
    rank_steps,
)


@pytest.fixture(scope="module")
def frontier() -> Frontier:
    prof = perseus.load_profile("profiles/gpt3-175b_a100-sxm_8stage.csv").select_stages(range(2))
    return perseus.solve_frontier(prof, perseus.interleaved_1f1b(2, 4, 2), 83.64)


def old_plans_doc(f: Frontier) -> dict:
    """What ``to_json(plans=True)`` wrote before plans were encoded."""
    doc = f.to_json()
    for i, pt in enumerate(doc["points"]):
        pt["plan"] = [
            [{k: s[k] for k in ("instruction", "microbatch", "frequency")} for s in rank]
            for rank in f.plan_steps(i)
        ]
    return doc


@pytest.mark.parametrize("shape", [(1, 5), (7, 300), (40, 1000), (0, 10)])
def test_stored_rows_round_trip(shape: tuple[int, int]) -> None:
    rng = np.random.default_rng(len(shape) + shape[0])
    plans = rng.integers(0, 256, size=shape, dtype=np.uint8)
    if shape[0] > 2:  # neighbours sharing most entries, as on a frontier
        plans[1:] = plans[0]
        plans[1:, ::7] = rng.integers(0, 256, size=plans[1:, ::7].shape, dtype=np.uint8)
    out = decode_rows(encode_rows(plans), shape)
    assert out.dtype == np.uint8 and np.array_equal(out, plans)
    with pytest.raises(ValueError, match="bytes for shape"):
        decode_rows(encode_rows(plans), (shape[0] + 1, shape[1]))


def test_rank_plans_round_trip_with_a_wide_clock_table() -> None:
    rng = np.random.default_rng(3)
    orders = [[("forward", m, r) for m in range(150)] for r in range(2)]
    op_freqs = np.sort(rng.choice(np.arange(100, 2000), size=(300, 200)), axis=1)[:, ::-1]
    plans = rng.integers(0, 200, size=(6, 300), dtype=np.uint8)
    enc, rows = encode_rank_plans(orders, op_freqs, plans)
    assert enc["dtype"] == "uint16"  # a rank with more than 256 clocks
    doc = json.loads(json.dumps({"plan_encoding": enc, "points": [{"plan": r} for r in rows]}))
    for i, steps in enumerate(decode_rank_plans(doc)):
        got = [s["frequency"] for rank in steps for s in rank]
        assert got == op_freqs[np.arange(300), plans[i]].tolist()


def test_the_frontiers_documents_round_trip_and_old_ones_still_read(frontier: Frontier) -> None:
    f = frontier
    doc = json.loads(json.dumps(f.to_json(plans=True)))
    decoded = list(decode_rank_plans(doc))
    assert len(decoded) == len(f) > 10
    for i in (0, len(f) // 2, len(f) - 1):
        assert decoded[i] == f.plan_steps(i) == rank_steps(doc, i)
        # interleaved: each rank's list names its model stages (chunks)
        assert {s["stage"] for s in decoded[i][1]} == {1, 3}
    old = json.loads(json.dumps(old_plans_doc(f)))
    assert rank_steps(old, 2) == old["points"][2]["plan"]
    assert len(json.dumps(doc)) < len(json.dumps(old)) / 10
    # the stored form: rebuilt exactly, and the old base64 form still loads
    stored = json.loads(json.dumps(f.to_json(compact=True)))
    assert "plans" not in stored["encoded"]
    assert np.array_equal(Frontier.from_json(stored).plans, f.plans)
    enc = stored["encoded"]
    enc["plans"] = base64.b64encode(np.ascontiguousarray(f.plans).tobytes()).decode()
    del enc["plans_z"]
    back = Frontier.from_json(stored)
    assert np.array_equal(back.plans, f.plans) and back.plans.flags.writeable
    with pytest.raises(IndexError):
        rank_steps(doc, len(f))
