"""The server's columnar form of a large report's measurements.

The values the service takes from and gives to the ranks are the wire's, written once for both
ends in :mod:`perseus_common.wire.values` (the service imports them from there). This module adds
:class:`InstructionColumns` (numpy: the rank client never needs it). Only the gRPC adapter
converts values to and from protobuf, so the service never builds or parses a wire message.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, overload

import numpy as np
import numpy.typing as npt

from perseus_common.wire.values import InstructionReport

__all__ = ["InstructionColumns"]


@dataclass(frozen=True, eq=False)
class InstructionColumns(Sequence[InstructionReport]):
    """The measurements of a large report as columns: one array per field.

    The instruction names are indices into ``kinds`` (its distinct names, in first-seen order).

    A sequence of :class:`InstructionReport` (equal to the tuple of the same measurements, each
    item built on access), so code written for the tuple works unchanged; the report path reads
    the arrays instead, which keeps a report of ``n`` measurements at a few objects rather than
    ``n`` (array operations: validation and per-stage medians in ``O(n log n)`` C work).
    """

    kinds: tuple[str, ...]
    kind: npt.NDArray[np.int32]
    microbatch: npt.NDArray[np.int32]
    frequency_mhz: npt.NDArray[np.int32]
    time: npt.NDArray[np.float64]
    energy: npt.NDArray[np.float64]
    stage: npt.NDArray[np.int32]

    def __len__(self) -> int:
        return len(self.kind)

    @overload
    def __getitem__(self, j: int) -> InstructionReport: ...
    @overload
    def __getitem__(self, j: slice) -> tuple[InstructionReport, ...]: ...
    def __getitem__(self, j: int | slice) -> InstructionReport | tuple[InstructionReport, ...]:
        if isinstance(j, slice):
            return tuple(self[k] for k in range(*j.indices(len(self))))
        if j < 0:
            j += len(self)
        if not 0 <= j < len(self):
            raise IndexError(j)
        return InstructionReport(
            instruction=self.kinds[int(self.kind[j])],
            microbatch=int(self.microbatch[j]),
            frequency_mhz=int(self.frequency_mhz[j]),
            time=float(self.time[j]),
            energy=float(self.energy[j]),
            stage=int(self.stage[j]),
        )

    def __iter__(self) -> Iterator[InstructionReport]:
        kinds = self.kinds
        for k, mb, f, t, e, s in zip(
            self.kind.tolist(),
            self.microbatch.tolist(),
            self.frequency_mhz.tolist(),
            self.time.tolist(),
            self.energy.tolist(),
            self.stage.tolist(),
            strict=True,
        ):
            yield InstructionReport(kinds[k], mb, f, t, e, s)

    def names(self) -> list[str]:
        """The instruction name of each measurement."""
        kinds = self.kinds
        return [kinds[k] for k in self.kind.tolist()]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, InstructionColumns | tuple | list):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__: Any = None
