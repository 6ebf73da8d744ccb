"""Per-stage computation profiles: time and energy of each instruction at each GPU frequency.

The on-disk form is the ``stage,instruction,frequency,time,energy`` CSV used by Zeus and the
Perseus paper (one row per stage, instruction kind and SM frequency in MHz; time in seconds and
energy in joules of one microbatch), or the equivalent JSON::

    {"format": "perseus-profile/1",
     "records": [{"stage": 0, "instruction": "forward", "frequency": 1410,
                  "time": 0.0501, "energy": 23.8}, ...]}

The same file may carry communication: ``transfer_forward`` / ``transfer_backward`` rows per
stage boundary and ``phase:<name>`` rows per stage (see :mod:`perseus_common.communication` for
the format), read into :attr:`Profile.communication`; a profile without them has none.

Everything read is validated; errors are :class:`~perseus.errors.ProfileError` naming the row and
field at fault.

Which options are worth running is decided on the *effective* cost ``e - P_block * t``: a GPU
that finishes early waits for its pipeline neighbours and draws the blocking power ``P_block``
meanwhile, so only the energy above that baseline is a true cost of running an instruction.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from perseus.errors import ProfileError
from perseus_common import communication as communication_rows
from perseus_common import profile_csv
from perseus_common.communication import Communication
from perseus_common.kinds import INSTRUCTION_KINDS

__all__ = [
    "INSTRUCTION_KINDS",
    "InstructionProfile",
    "Profile",
    "load_profile",
    "parse_profile_csv",
    "parse_profile_json",
    "parse_stage_list",
    "pareto_indices",
    "lower_hull_indices",
]

_COLUMNS = profile_csv.COLUMNS
FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, eq=False)
class InstructionProfile:
    """Measurements of one (stage, instruction kind), sorted by decreasing frequency."""

    frequencies: IntArray
    times: FloatArray
    energies: FloatArray

    @property
    def max_frequency(self) -> int:
        """The highest measured clock (MHz): the first, as options are sorted."""
        return int(self.frequencies[0])

    def effective_costs(self, blocking_power: float) -> FloatArray:
        """``energy - blocking_power * time`` of every option."""
        return self.energies - blocking_power * self.times

    def pareto(self, blocking_power: float) -> IntArray:
        """Indices of the options not dominated in (time, effective cost), by increasing time."""
        return pareto_indices(self.times, self.effective_costs(blocking_power))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, InstructionProfile):
            return NotImplemented
        return (
            np.array_equal(self.frequencies, other.frequencies)
            and np.array_equal(self.times, other.times)
            and np.array_equal(self.energies, other.energies)
        )

    __hash__ = None  # type: ignore[assignment]


def pareto_indices(times: FloatArray, costs: FloatArray) -> IntArray:
    """Indices of the points no other point beats in both time and cost, by increasing time.

    Of points with equal time only the cheapest is kept; the result has strictly increasing
    times and strictly decreasing costs.
    """
    order = np.lexsort((costs, times))
    keep: list[int] = []
    best = math.inf
    for i in order:
        if costs[i] < best:
            if keep and times[keep[-1]] == times[i]:
                continue
            keep.append(int(i))
            best = float(costs[i])
    return np.asarray(keep, dtype=np.int64)


def lower_hull_indices(times: FloatArray, costs: FloatArray) -> IntArray:
    """Indices of the vertices of the lower convex hull, by increasing time.

    Found by Andrew's monotone chain.

    The indices are into the given arrays, which must be sorted by time and Pareto-filtered.
    """
    hull: list[int] = []
    for i in range(len(times)):
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            # Drop b if it lies on or above segment a-i.
            cross = (times[b] - times[a]) * (costs[i] - costs[a]) - (costs[b] - costs[a]) * (
                times[i] - times[a]
            )
            if cross <= 0:
                hull.pop()
            else:
                break
        hull.append(i)
    return np.asarray(hull, dtype=np.int64)


@dataclass(frozen=True)
class Profile:
    """Validated measurements for every pipeline stage and instruction kind."""

    entries: Mapping[tuple[int, str], InstructionProfile]
    stages: int = field(init=False)
    kinds: tuple[str, ...] = field(init=False)
    #: P2P transfers and iteration-end phases (none: what a compute-only profile means).
    communication: Communication = field(default_factory=Communication.none)

    def __post_init__(self) -> None:
        stages = sorted({s for s, _ in self.entries})
        kinds = tuple(k for k in INSTRUCTION_KINDS if any(kk == k for _, kk in self.entries))
        object.__setattr__(self, "stages", len(stages))
        object.__setattr__(self, "kinds", kinds)
        try:
            self.communication.check_stages(len(stages))
        except profile_csv.ProfileFormatError as e:
            raise ProfileError(e.detail, field=e.field, row=e.row) from None

    def __getitem__(self, key: tuple[int, str]) -> InstructionProfile:
        try:
            return self.entries[key]
        except KeyError:
            raise ProfileError(
                f"the profile has no measurements for stage {key[0]} instruction {key[1]!r}",
                field="instruction",
            ) from None

    def has(self, stage: int, kind: str) -> bool:
        """Whether the profile measured instruction ``kind`` of ``stage``."""
        return (stage, kind) in self.entries

    def select_stages(self, stages: Iterable[int]) -> Profile:
        """A profile of ``stages`` only, renumbered ``0..k-1`` in the order given.

        For a job with fewer stages than the profile: ``profile.select_stages(range(4))`` keeps
        an eight-stage profile's first four stages (what ``perseus frontier --profile-stages 0-3``
        and ``perseus demo --stages 4`` use). Raises :class:`ProfileError` (field ``stages``) for
        an empty selection, a stage the profile lacks, or a stage named twice.
        """
        chosen = list(stages)
        if not chosen:
            raise ProfileError("select at least one stage", field="stages")
        seen: set[int] = set()
        for s in chosen:
            if isinstance(s, bool) or not isinstance(s, int | np.integer):
                raise ProfileError(f"stage {s!r} is not an integer", field="stages")
            if not (0 <= s < self.stages):
                raise ProfileError(
                    f"stage {s} is not in the profile (it has stages 0..{self.stages - 1})",
                    field="stages",
                )
            if s in seen:
                raise ProfileError(f"stage {s} is selected twice", field="stages")
            seen.add(int(s))
        renumber = {int(old): new for new, old in enumerate(chosen)}
        return Profile(
            {(renumber[s], k): p for (s, k), p in self.entries.items() if s in renumber},
            self.communication.select_stages([int(s) for s in chosen]),
        )

    def with_communication(self, communication: Communication) -> Profile:
        """A copy with ``communication`` in place of this profile's."""
        return Profile(dict(self.entries), communication)

    @property
    def frequencies(self) -> list[int]:
        """Every frequency measured anywhere in the profile, decreasing."""
        freqs: set[int] = set()
        for p in self.entries.values():
            freqs.update(int(f) for f in p.frequencies)
        return sorted(freqs, reverse=True)

    def records(self) -> Iterable[dict[str, Any]]:
        """Every row: computation by stage and kind, then communication.

        A communication row's ``frequency`` and ``energy`` may be None: an empty field.
        """
        yield from self.compute_records()
        yield from self.communication.records()

    def compute_records(self) -> Iterable[dict[str, Any]]:
        """The computation rows as CSV-like records, by stage and then instruction kind."""
        for (stage, kind), p in sorted(
            self.entries.items(), key=lambda kv: (kv[0][0], INSTRUCTION_KINDS.index(kv[0][1]))
        ):
            for f, t, e in zip(p.frequencies, p.times, p.energies, strict=True):
                yield {
                    "stage": stage,
                    "instruction": kind,
                    "frequency": int(f),
                    "time": float(t),
                    "energy": float(e),
                }

    def to_csv(self) -> str:
        """The profile as CSV text, one row per record, header first."""
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(_COLUMNS)
        for r in self.records():
            writer.writerow([_cell(r[c]) for c in _COLUMNS])
        return out.getvalue()

    def to_json(self) -> dict[str, Any]:
        """The profile as a ``perseus-profile/1`` JSON document."""
        return {"format": "perseus-profile/1", "records": list(self.records())}

    def scaled(
        self,
        stage: int | None = None,
        *,
        time_factor: float = 1.0,
        energy_factor: float | None = None,
    ) -> Profile:
        """A copy with one stage's (or every stage's) times multiplied by ``time_factor``.

        Energies scale by ``energy_factor`` (default: the same factor, i.e. the same power for a
        longer time, which is what a throttled GPU looks like).
        """
        if not (time_factor > 0 and math.isfinite(time_factor)):
            raise ProfileError("must be a positive finite number", field="time_factor")
        ef = time_factor if energy_factor is None else energy_factor
        entries = {}
        for (s, k), p in self.entries.items():
            if stage is None or s == stage:
                p = InstructionProfile(p.frequencies, p.times * time_factor, p.energies * ef)
            entries[(s, k)] = p
        return Profile(entries, self.communication)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    return repr(value) if isinstance(value, float) else str(value)


def _parse_records(rows: Iterable[tuple[int, Mapping[str, Any]]]) -> Profile:
    comm: list[tuple[int, Mapping[str, Any]]] = []
    try:
        data = profile_csv.parse_rows(rows, communication=comm)
        profile_csv.check_complete(data)
        stages = len({s for s, _ in data})
        communication = communication_rows.parse_rows(comm, stages=stages)
    except profile_csv.ProfileFormatError as e:
        raise ProfileError(e.detail, field=e.field, row=e.row) from None
    entries: dict[tuple[int, str], InstructionProfile] = {}
    for sk, opts in data.items():
        entries[sk] = InstructionProfile(
            np.array([o[0] for o in opts], dtype=np.int64),
            np.array([o[1] for o in opts], dtype=np.float64),
            np.array([o[2] for o in opts], dtype=np.float64),
        )
    return Profile(entries, communication)


def parse_profile_csv(text: str) -> Profile:
    """Parse and validate a ``stage,instruction,frequency,time,energy`` CSV document."""
    try:
        return _parse_records(profile_csv.csv_rows(text))
    except profile_csv.ProfileFormatError as e:
        raise ProfileError(e.detail, field=e.field, row=e.row) from None


def parse_profile_json(obj: Any) -> Profile:
    """Validate a profile given as JSON: a parsed object, or a string of JSON.

    A string is parsed with the shared reader's bounds on nesting and integer length.
    """
    if isinstance(obj, str | bytes):
        try:
            obj = profile_csv.load_json(obj)
        except profile_csv.ProfileFormatError as e:
            raise ProfileError(e.detail, field=e.field, row=e.row) from None
    records = obj.get("records") if isinstance(obj, dict) else obj
    if not isinstance(records, list):
        raise ProfileError(
            "expected a list of records or an object with a 'records' list", field="records"
        )

    def rows() -> Iterable[tuple[int, Mapping[str, Any]]]:
        for i, rec in enumerate(records):
            if not isinstance(rec, dict):
                raise ProfileError("each record must be an object", field="records", row=i)
            yield i, rec

    return _parse_records(rows())


def parse_stage_list(text: str, limit: int = 100_000) -> list[int]:
    """Stages from a list such as ``"0-3"``, ``"0,2,4"`` or ``"4-7,0"``, in the order written.

    Ranges are inclusive. :class:`ProfileError` (field ``stages``) names what is malformed, or a
    list naming more than ``limit`` stages in all (counted before the list is built, so a short
    text of many long ranges costs nothing).
    """
    ranges: list[tuple[int, int]] = []
    total = 0
    for part in text.split(","):
        item = part.strip()
        lo, sep, hi = item.partition("-")
        try:
            first = int(lo)
            last = int(hi) if sep else first
        except ValueError:
            raise ProfileError(
                f"{item[:32]!r} is not a stage or a range of stages like 0-3", field="stages"
            ) from None
        if first < 0 or last < first:
            raise ProfileError(f"{item[:32]!r} is not a range of stages like 0-3", field="stages")
        total += last - first + 1
        if total > limit:
            raise ProfileError(
                f"the list names more than {limit} stages in all (up to {item[:32]!r})",
                field="stages",
            )
        ranges.append((first, last))
    return [s for first, last in ranges for s in range(first, last + 1)]


def load_profile(path: str | Path) -> Profile:
    """Read a profile from a ``.csv`` or ``.json`` file."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ProfileError(f"cannot read {p}: {e.strerror}") from None
    if p.suffix.lower() == ".json" or text.lstrip().startswith(("{", "[")):
        return parse_profile_json(text)
    return parse_profile_csv(text)
