"""Communication in a pipeline iteration: P2P transfers between stages and iteration-end phases.

A *boundary* ``b`` lies between model stage ``b`` and ``b + 1`` (``0 <= b < stages - 1``). Its
``"forward"`` transfer carries one microbatch's activations from stage ``b`` to ``b + 1``, its
``"backward"`` transfer the gradients from ``b + 1`` back to ``b``. A *phase* is work a stage's
rank does once per iteration after its last instruction (the data-parallel gradient reduction
that backward did not overlap, the optimizer step). Times are seconds (per microbatch for a
transfer), powers watts, energies joules.

Profiles carry communication in the same file as computation (:mod:`perseus_common.profile_csv`
reads the compute rows, :func:`parse_rows` here the others)::

    stage,instruction,frequency,time,energy
    0,transfer_forward,,0.0021,
    0,transfer_backward,1410,0.0022,0.33
    0,transfer_backward,1005,0.0025,0.37
    0,phase:optimizer,,0.012,4.1

* ``transfer_forward`` / ``transfer_backward``: ``stage`` is the boundary; ``frequency`` empty
  for a time that does not depend on the SM clock, or the clock (MHz) of the instruction that
  produced the data, one row per clock; ``energy`` empty for a GPU drawing the blocking power
  during the transfer, else the joules of one transfer (its power, ``energy / time``, is taken
  from the fixed row or the highest clock's row).
* ``phase:<name>``: ``stage`` is the model stage whose rank runs it; ``frequency`` empty or one
  row per clock; ``energy`` empty for the blocking power. A stage's phases run in file order.

A profile without such rows has no communication (:meth:`Communication.none`): every old profile
keeps its meaning. Errors are :class:`~perseus_common.profile_csv.ProfileFormatError` naming the
row and the field.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from perseus_common.profile_csv import (
    MAX_FIELD_CHARS,
    MAX_FREQUENCY_MHZ,
    MAX_STAGE,
    ProfileFormatError,
    as_int,
    as_nonnegative_float,
    as_positive_float,
    is_communication_instruction,
)

__all__ = [
    "DIRECTIONS",
    "TRANSFER_INSTRUCTIONS",
    "PHASE_PREFIX",
    "Transfer",
    "Phase",
    "Communication",
    "parse_rows",
    "is_communication_instruction",
]

#: Directions of a transfer across a boundary.
DIRECTIONS: tuple[str, ...] = ("forward", "backward")
#: Profile ``instruction`` of each direction's transfer rows.
TRANSFER_INSTRUCTIONS: dict[str, str] = {
    "transfer_forward": "forward",
    "transfer_backward": "backward",
}
#: Profile ``instruction`` prefix of a phase row (``phase:optimizer``).
PHASE_PREFIX = "phase:"
_PHASE_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")


def _check_time(value: float, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ProfileFormatError(f"{what} must be a number, got {value!r}", field="time")
    if not (math.isfinite(value) and value >= 0):
        raise ProfileFormatError(f"{what} must be finite and >= 0, got {value!r}", field="time")
    return float(value)


def _check_clock(clock: Any) -> int:
    if isinstance(clock, bool) or not isinstance(clock, int) or not 0 < clock <= MAX_FREQUENCY_MHZ:
        raise ProfileFormatError(
            f"clock must be an integer in 1..{MAX_FREQUENCY_MHZ} MHz, got {clock!r}",
            field="frequency",
        )
    return clock


def _nearest(clocks: Iterable[int], clock: int) -> int:
    """The measured clock closest to ``clock`` (the higher one on a tie)."""
    return min(clocks, key=lambda c: (abs(c - clock), -c))


@dataclass(frozen=True)
class Transfer:
    """One microbatch's transfer across a boundary in one direction.

    Attributes:
        time: seconds; with ``times_by_clock``, the time at its highest clock.
        power: watts the GPU draws during it; None = the blocking power.
        times_by_clock: seconds by the clock (MHz) of the instruction that produced the data.
    """

    time: float
    power: float | None = None
    times_by_clock: Mapping[int, float] | None = None

    def __post_init__(self) -> None:
        _check_time(self.time, "a transfer's time")
        if self.power is not None and (
            isinstance(self.power, bool)
            or not isinstance(self.power, int | float)
            or not (math.isfinite(self.power) and self.power >= 0)
        ):
            raise ProfileFormatError(
                f"a transfer's power must be finite and >= 0, got {self.power!r}", field="energy"
            )
        if self.times_by_clock is not None:
            by = {
                _check_clock(c): _check_time(t, "a transfer's time")
                for c, t in self.times_by_clock.items()
            }
            if not by:
                raise ProfileFormatError("times_by_clock is empty", field="frequency")
            object.__setattr__(self, "times_by_clock", dict(sorted(by.items(), reverse=True)))

    def time_at(self, clock: int | None) -> float:
        """Seconds when the producing instruction ran at ``clock``.

        The nearest measured clock counts; ``time`` when there is no per-clock data or no
        clock.
        """
        if self.times_by_clock is None or clock is None:
            return self.time
        return self.times_by_clock[_nearest(self.times_by_clock, int(clock))]


@dataclass(frozen=True)
class Phase:
    """An iteration-end phase of one stage's rank (gradient reduction not overlapped, optimizer).

    Attributes:
        name: what it is (letters, digits, ``_ . -``).
        time: seconds; with ``by_clock``, the entry of the highest clock.
        energy: joules; None = the blocking power for ``time``.
        by_clock: ``{clock: (time, energy or None)}``.
    """

    name: str
    time: float
    energy: float | None = None
    by_clock: Mapping[int, tuple[float, float | None]] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _PHASE_NAME.match(self.name):
            raise ProfileFormatError(
                f"a phase name is letters, digits, '_', '.' or '-', got {self.name!r}",
                field="instruction",
            )
        if len(self.name) + len(PHASE_PREFIX) > MAX_FIELD_CHARS:
            raise ProfileFormatError("phase name too long", field="instruction")
        _check_time(self.time, "a phase's time")
        if self.energy is not None:
            _check_energy(self.energy)
        if self.by_clock is not None:
            by = {}
            for c, te in self.by_clock.items():
                t, e = te
                by[_check_clock(c)] = (
                    _check_time(t, "a phase's time"),
                    None if e is None else _check_energy(e),
                )
            if not by:
                raise ProfileFormatError("by_clock is empty", field="frequency")
            object.__setattr__(self, "by_clock", dict(sorted(by.items(), reverse=True)))


def _check_energy(e: Any) -> float:
    if isinstance(e, bool) or not isinstance(e, int | float) or not (math.isfinite(e) and e >= 0):
        raise ProfileFormatError(f"energy must be finite and >= 0, got {e!r}", field="energy")
    return float(e)


@dataclass(frozen=True)
class Communication:
    """The transfers of every boundary and direction and the phases of every stage.

    ``transfers[(boundary, direction)]``; a boundary and direction not given takes no time.
    ``phases[stage]``: that stage's phases in the order they run.
    """

    transfers: Mapping[tuple[int, str], Transfer] = field(default_factory=dict)
    phases: Mapping[int, Sequence[Phase]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        tr: dict[tuple[int, str], Transfer] = {}
        for key, t in self.transfers.items():
            b, d = key
            if isinstance(b, bool) or not isinstance(b, int) or not 0 <= b < MAX_STAGE:
                raise ProfileFormatError(
                    f"boundary must be an integer >= 0, got {b!r}", field="stage"
                )
            if d not in DIRECTIONS:
                raise ProfileFormatError(
                    f"direction must be one of {', '.join(DIRECTIONS)}, got {d!r}",
                    field="instruction",
                )
            if not isinstance(t, Transfer):
                raise TypeError(f"transfers[{key}] is not a Transfer")
            tr[(b, d)] = t
        ph: dict[int, tuple[Phase, ...]] = {}
        for s, phases in self.phases.items():
            if isinstance(s, bool) or not isinstance(s, int) or not 0 <= s <= MAX_STAGE:
                raise ProfileFormatError(f"stage must be an integer >= 0, got {s!r}", field="stage")
            ps = tuple(phases)
            if not all(isinstance(p, Phase) for p in ps):
                raise TypeError(f"phases[{s}] holds something that is not a Phase")
            names = [p.name for p in ps]
            if len(set(names)) != len(names):
                raise ProfileFormatError(f"stage {s} names a phase twice", field="instruction")
            if ps:
                ph[s] = ps
        object.__setattr__(
            self,
            "transfers",
            dict(sorted(tr.items(), key=lambda kv: (kv[0][0], DIRECTIONS.index(kv[0][1])))),
        )
        object.__setattr__(self, "phases", dict(sorted(ph.items())))

    @classmethod
    def none(cls) -> Communication:
        """No communication: what every profile without transfer or phase rows means."""
        return cls({}, {})

    @property
    def is_none(self) -> bool:
        """Whether the profile measured no transfers and no phases."""
        return not self.transfers and not self.phases

    def transfer(self, boundary: int, direction: str) -> Transfer | None:
        """The transfer across ``boundary`` in ``direction``, or ``None`` when not measured."""
        return self.transfers.get((boundary, direction))

    def with_transfer(self, boundary: int, direction: str, time: float) -> Communication:
        """A copy with one transfer's time replaced by ``time``; the power is kept.

        ``time`` is a measured time: it holds at every clock, so per-clock times are
        dropped.
        """
        old = self.transfers.get((boundary, direction))
        new = dict(self.transfers)
        new[(boundary, direction)] = Transfer(time, None if old is None else old.power)
        return Communication(new, self.phases)

    def check_stages(self, stages: int) -> None:
        """Raise unless every boundary and every phase's stage are within ``stages``.

        Every boundary must be below ``stages - 1`` and every phase's stage below
        ``stages``.
        """
        for b, d in self.transfers:
            if b >= stages - 1:
                raise ProfileFormatError(
                    f"transfer_{d} at boundary {b}, but a {stages}-stage pipeline has "
                    f"boundaries 0..{stages - 2}",
                    field="stage",
                )
        for s in self.phases:
            if s >= stages:
                raise ProfileFormatError(
                    f"a phase of stage {s}, but the pipeline has stages 0..{stages - 1}",
                    field="stage",
                )

    def select_stages(self, chosen: Sequence[int]) -> Communication:
        """The communication of ``chosen`` stages, renumbered ``0..k-1``.

        See ``Profile.select_stages``. New boundary ``i`` keeps old boundary ``chosen[i]``'s
        transfers when ``chosen[i + 1] == chosen[i] + 1``; stages not adjacent before have
        no measured link, and their transfers take no time.
        """
        transfers: dict[tuple[int, str], Transfer] = {}
        for i in range(len(chosen) - 1):
            if chosen[i + 1] == chosen[i] + 1:
                for d in DIRECTIONS:
                    t = self.transfers.get((chosen[i], d))
                    if t is not None:
                        transfers[(i, d)] = t
        phases = {i: self.phases[s] for i, s in enumerate(chosen) if s in self.phases}
        return Communication(transfers, phases)

    def records(self) -> Iterator[dict[str, Any]]:
        """Profile rows (``stage, instruction, frequency, time, energy``; None = empty)."""
        for (b, d), t in self.transfers.items():
            kind = f"transfer_{d}"
            if t.times_by_clock is None:
                yield _record(b, kind, None, t.time, None if t.power is None else t.power * t.time)
            else:
                for c, tc in t.times_by_clock.items():
                    yield _record(b, kind, c, tc, None if t.power is None else t.power * tc)
        for s, phases in self.phases.items():
            for p in phases:
                kind = PHASE_PREFIX + p.name
                if p.by_clock is None:
                    yield _record(s, kind, None, p.time, p.energy)
                else:
                    for c, (tc, ec) in p.by_clock.items():
                        yield _record(s, kind, c, tc, ec)

    def to_json(self) -> dict[str, Any]:
        """The communication as JSON: ``{"records": [...]}``."""
        return {"records": list(self.records())}

    @classmethod
    def from_json(cls, obj: Any) -> Communication:
        """From :meth:`to_json`'s object (or a plain list of records)."""
        records = obj.get("records") if isinstance(obj, dict) else obj
        if not isinstance(records, list):
            raise ProfileFormatError(
                "expected a list of records or an object with a 'records' list", field="records"
            )
        rows = []
        for i, rec in enumerate(records):
            if not isinstance(rec, dict):
                raise ProfileFormatError("each record must be an object", field="records", row=i)
            rows.append((i, rec))
        return parse_rows(rows)


def _record(
    stage: int, kind: str, clock: int | None, time: float, energy: float | None
) -> dict[str, Any]:
    return {"stage": stage, "instruction": kind, "frequency": clock, "time": time, "energy": energy}


def _empty(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def parse_rows(
    rows: Iterable[tuple[int, Mapping[str, Any]]], *, stages: int | None = None
) -> Communication:
    """Validate the communication rows of a profile into a :class:`Communication`.

    The rows are ``(row number, record)``; rows of other instructions are not expected here.

    ``stage`` is an integer >= 0 (with ``stages``, a boundary below ``stages - 1`` or a stage
    below ``stages``); ``frequency`` empty or a clock; ``time`` positive and finite; ``energy``
    empty or >= 0. A boundary, direction and clock occurs once, and a transfer or phase is given
    either as one row without a clock or as rows with clocks, never both.
    """
    # (key) -> {clock or None: (time, energy, row)}; key = ("t", b, dir) or ("p", stage, name)
    found: dict[tuple[Any, ...], dict[int | None, tuple[float, float | None, int]]] = {}
    for rowno, rec in rows:
        for col in ("stage", "instruction", "time"):
            if col not in rec or _empty(rec[col]):
                raise ProfileFormatError("missing value", field=col, row=rowno)
        if isinstance(rec["instruction"], str) and len(rec["instruction"]) > MAX_FIELD_CHARS:
            raise ProfileFormatError(
                f"at most {MAX_FIELD_CHARS} characters", field="instruction", row=rowno
            )
        kind = str(rec["instruction"]).strip()
        stage = as_int(rec["stage"], "stage", rowno)
        if stage < 0 or stage > MAX_STAGE:
            raise ProfileFormatError(
                f"stage must be in 0..{MAX_STAGE}, got {stage}", field="stage", row=rowno
            )
        if kind in TRANSFER_INSTRUCTIONS:
            key: tuple[Any, ...] = ("t", stage, TRANSFER_INSTRUCTIONS[kind])
            if stages is not None and stage >= stages - 1:
                raise ProfileFormatError(
                    f"{kind} at boundary {stage}, but a {stages}-stage profile has boundaries "
                    + (f"0..{stages - 2}" if stages > 1 else "none"),
                    field="stage",
                    row=rowno,
                )
        elif kind.startswith(PHASE_PREFIX):
            name = kind[len(PHASE_PREFIX) :]
            if not _PHASE_NAME.match(name):
                raise ProfileFormatError(
                    f"phase name {name!r}: letters, digits, '_', '.' or '-'",
                    field="instruction",
                    row=rowno,
                )
            key = ("p", stage, name)
            if stages is not None and stage >= stages:
                raise ProfileFormatError(
                    f"a phase of stage {stage}, but the profile has stages 0..{stages - 1}",
                    field="stage",
                    row=rowno,
                )
        else:
            raise ProfileFormatError(
                f"{kind!r} is not a transfer or phase instruction", field="instruction", row=rowno
            )
        clock: int | None = None
        if "frequency" in rec and not _empty(rec["frequency"]):
            clock = as_int(rec["frequency"], "frequency", rowno)
            if not 0 < clock <= MAX_FREQUENCY_MHZ:
                raise ProfileFormatError(
                    f"frequency must be in 1..{MAX_FREQUENCY_MHZ} MHz, got {clock}",
                    field="frequency",
                    row=rowno,
                )
        time = as_positive_float(rec["time"], "time", rowno)
        energy = None
        if "energy" in rec and not _empty(rec["energy"]):
            energy = as_nonnegative_float(rec["energy"], "energy", rowno)
        entries = found.setdefault(key, {})
        if clock in entries:
            at = "" if clock is None else f" at {clock} MHz"
            raise ProfileFormatError(
                f"duplicate {kind} of stage {stage}{at} (first on row {entries[clock][2]})",
                field="frequency",
                row=rowno,
            )
        if entries and ((clock is None) != (None in entries)):
            first = next(iter(entries.values()))[2]
            raise ProfileFormatError(
                f"{kind} of stage {stage} is given both with and without a clock (row {first}); "
                "give one row without a frequency, or one row per clock",
                field="frequency",
                row=rowno,
            )
        entries[clock] = (time, energy, rowno)
    transfers: dict[tuple[int, str], Transfer] = {}
    phases: dict[int, list[Phase]] = {}
    for key, entries in found.items():
        top = (
            entries[None] if None in entries else entries[max(c for c in entries if c is not None)]
        )
        by_clock = None if None in entries else entries
        if key[0] == "t":
            power = None if top[1] is None else top[1] / top[0]
            transfers[(key[1], key[2])] = Transfer(
                top[0],
                power,
                None
                if by_clock is None
                else {c: v[0] for c, v in by_clock.items() if c is not None},
            )
        else:
            phases.setdefault(key[1], []).append(
                Phase(
                    key[2],
                    top[0],
                    top[1],
                    None
                    if by_clock is None
                    else {c: (v[0], v[1]) for c, v in by_clock.items() if c is not None},
                )
            )
    return Communication(transfers, phases)
