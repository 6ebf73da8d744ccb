"""``domain/instruction_columns.py``: a large report's measurements as columns.

:class:`InstructionColumns` is a sequence of the measurements it holds, equal to their tuple, so
code written for the tuple works unchanged. That the gRPC decoder's columns give what the
one-object-per-measurement path gave is ``tests/server/grpc/test_report_decoder.py``'s.
"""

from __future__ import annotations

import numpy as np
import pytest

from perseus_common.wire.values import InstructionReport
from perseus_server.domain.instruction_columns import InstructionColumns


def _columns(names: list[str], stage: int = 1) -> InstructionColumns:
    kinds = tuple(dict.fromkeys(names))
    n = len(names)
    return InstructionColumns(
        kinds=kinds,
        kind=np.array([kinds.index(k) for k in names], dtype=np.int32),
        microbatch=np.arange(n, dtype=np.int32),
        frequency_mhz=np.full(n, 1410, dtype=np.int32),
        time=np.full(n, 0.5),
        energy=np.zeros(n),
        stage=np.full(n, stage, dtype=np.int32),
    )


def test_columns_are_a_sequence_of_measurements() -> None:
    names = ["forward", "backward", "forward"]
    cols = _columns(names)
    rows = tuple(InstructionReport(k, j, 1410, 0.5, 0.0, 1) for j, k in enumerate(names))
    assert cols.kinds == ("forward", "backward") and cols.names() == names
    assert len(cols) == 3 and bool(cols) and not bool(_columns([]))
    assert cols[-1] == cols[2] == rows[2]
    assert cols[1:] == rows[1:]
    assert cols == rows and rows == cols and cols == list(rows) and tuple(cols) == rows
    assert cols != rows[:2] and cols != _columns(names, stage=2)
    with pytest.raises(IndexError):
        cols[3]
    with pytest.raises(IndexError):
        cols[-4]
    with pytest.raises(TypeError):
        hash(cols)
