"""The one reader of Perseus profiles: ``stage,instruction,frequency,time,energy`` rows.

A profile holds, for each pipeline stage, instruction kind and SM frequency (MHz), the time
(seconds) and energy (joules) of one microbatch: the CSV format of Zeus and the Perseus paper, or
the same records as JSON objects. This module validates rows and groups them, in plain Python so
that the light rank client can use it; :mod:`perseus.profiles` wraps the result in numpy arrays.

Errors are :class:`ProfileFormatError` naming the row and the field at fault. Every field is
bounded (:data:`MAX_FIELD_CHARS` characters, stages and frequencies within what the wire's int32
fields and a GPU clock can be), and :func:`load_json` parses JSON with a bounded nesting depth and
integer length, so hostile input costs time proportional to its size and never more.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from perseus_common.clocks import MAX_CLOCK_MHZ
from perseus_common.kinds import INSTRUCTION_KINDS
from perseus_common.located_error import LocatedError

__all__ = [
    "COLUMNS",
    "ProfileFormatError",
    "Measurements",
    "csv_rows",
    "parse_rows",
    "check_complete",
    "read_csv",
    "load_json",
    "MAX_FIELD_CHARS",
    "MAX_STAGE",
    "MAX_FREQUENCY_MHZ",
    "MAX_JSON_DEPTH",
    "as_int",
    "as_positive_float",
    "as_nonnegative_float",
    "is_communication_instruction",
]

#: The columns of a profile, in their canonical order.
COLUMNS = ("stage", "instruction", "frequency", "time", "energy")

#: Longest field of a row, in characters (a number or an instruction name is far shorter).
MAX_FIELD_CHARS = 64
#: Largest stage index (stages travel as int32 on the wire; a job has far fewer).
MAX_STAGE = 2**31 - 1
#: Largest SM clock in MHz: :data:`perseus_common.clocks.MAX_CLOCK_MHZ` under this module's name.
MAX_FREQUENCY_MHZ = MAX_CLOCK_MHZ
#: Deepest JSON nesting :func:`load_json` accepts (a profile needs 3: object, list, record).
MAX_JSON_DEPTH = 8
#: Longest integer literal :func:`load_json` accepts, in digits.
MAX_JSON_INT_DIGITS = 32

#: ``{(stage, kind): [(frequency, time, energy), ...]}``, options by decreasing frequency.
Measurements = dict[tuple[int, str], list[tuple[int, float, float]]]


def is_communication_instruction(kind: str) -> bool:
    """Whether a row's ``instruction`` is a transfer or a phase.

    Such rows are read by :func:`perseus_common.communication.parse_rows`, not as computation.
    """
    return kind in ("transfer_forward", "transfer_backward") or kind.startswith("phase:")


class ProfileFormatError(LocatedError):
    """A profile row or the profile as a whole is malformed.

    For ``detail``, ``field`` and ``row`` see :class:`~perseus_common.located_error.LocatedError`.
    """


def csv_rows(text: str) -> Iterator[tuple[int, dict[str, str]]]:
    """``(line number, {column: text})`` of each non-blank data row of a profile CSV."""
    if not text.strip():
        raise ProfileFormatError("the profile is empty")
    reader = csv.reader(io.StringIO(text))
    try:
        header = [h.strip() for h in next(reader)]
    except StopIteration:
        raise ProfileFormatError("the profile is empty") from None
    except csv.Error as e:
        raise ProfileFormatError(f"not valid CSV: {e}", row=1) from None
    if len(header) > 64 or any(len(h) > MAX_FIELD_CHARS for h in header):
        raise ProfileFormatError(
            f"at most 64 columns of at most {MAX_FIELD_CHARS} characters", row=1
        )
    missing = [c for c in COLUMNS if c not in header]
    if missing:
        raise ProfileFormatError(
            f"header must name the columns {','.join(COLUMNS)}; missing {', '.join(missing)}",
            row=1,
        )
    index = {c: header.index(c) for c in COLUMNS}
    lineno = 1
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            # The csv module refuses over-long fields and stray line breaks in unquoted fields.
            raise ProfileFormatError(f"not valid CSV: {e}", row=reader.line_num) from None
        lineno += 1
        if not row or all(not c.strip() for c in row):
            continue
        if len(row) != len(header):
            raise ProfileFormatError(f"expected {len(header)} fields, found {len(row)}", row=lineno)
        for c, i in index.items():
            if len(row[i]) > MAX_FIELD_CHARS:
                raise ProfileFormatError(
                    f"at most {MAX_FIELD_CHARS} characters, got {len(row[i])}", field=c, row=lineno
                )
        yield lineno, {c: row[i].strip() for c, i in index.items()}


def parse_rows(
    rows: Iterable[tuple[int, Mapping[str, Any]]],
    *,
    stages: Iterable[int] | None = None,
    communication: list[tuple[int, Mapping[str, Any]]] | None = None,
) -> Measurements:
    """Validate each row and group the options by (stage, kind), by decreasing frequency.

    Rows need every column; stages are integers >= 0, frequencies positive integers, times and
    energies positive and finite; a (stage, kind, frequency) may occur once. With ``stages``, only
    those stages' rows are kept (the others are still validated).

    Transfer and phase rows (:func:`is_communication_instruction`) are not computation: they are
    appended to ``communication`` when given (for
    :func:`perseus_common.communication.parse_rows` to validate), else skipped.
    """
    wanted = None if stages is None else {int(s) for s in stages}
    seen: dict[tuple[int, str, int], int] = {}
    data: Measurements = {}
    for rowno, rec in rows:
        ins = rec.get("instruction")
        if isinstance(ins, str) and is_communication_instruction(ins.strip()):
            if communication is not None:
                communication.append((rowno, rec))
            continue
        for col in COLUMNS:
            if (
                col not in rec
                or rec[col] is None
                or (isinstance(rec[col], str) and not rec[col].strip())
            ):
                raise ProfileFormatError("missing value", field=col, row=rowno)
        stage = as_int(rec["stage"], "stage", rowno)
        if stage < 0:
            raise ProfileFormatError(f"stage must be >= 0, got {stage}", field="stage", row=rowno)
        if stage > MAX_STAGE:
            raise ProfileFormatError(
                f"stage must be at most {MAX_STAGE}, got {stage}", field="stage", row=rowno
            )
        if isinstance(rec["instruction"], str) and len(rec["instruction"]) > MAX_FIELD_CHARS:
            raise ProfileFormatError(
                f"at most {MAX_FIELD_CHARS} characters", field="instruction", row=rowno
            )
        kind = str(rec["instruction"]).strip()
        if kind not in INSTRUCTION_KINDS:
            raise ProfileFormatError(
                f"unknown instruction {kind!r}; expected one of {', '.join(INSTRUCTION_KINDS)}, "
                "transfer_forward, transfer_backward or phase:<name>",
                field="instruction",
                row=rowno,
            )
        freq = as_int(rec["frequency"], "frequency", rowno)
        if freq <= 0:
            raise ProfileFormatError(
                f"frequency must be positive, got {freq}", field="frequency", row=rowno
            )
        if freq > MAX_FREQUENCY_MHZ:
            raise ProfileFormatError(
                f"frequency must be at most {MAX_FREQUENCY_MHZ} MHz, got {freq}",
                field="frequency",
                row=rowno,
            )
        time = as_positive_float(rec["time"], "time", rowno)
        energy = as_positive_float(rec["energy"], "energy", rowno)
        key = (stage, kind, freq)
        if key in seen:
            raise ProfileFormatError(
                f"duplicate measurement of stage {stage} {kind} at {freq} MHz (first on row {seen[key]})",
                field="frequency",
                row=rowno,
            )
        seen[key] = rowno
        if wanted is None or stage in wanted:
            data.setdefault((stage, kind), []).append((freq, time, energy))
    if not data:
        if wanted is not None:
            raise ProfileFormatError(f"no rows for stage(s) {sorted(wanted)}", field="stage")
        raise ProfileFormatError("the profile is empty: no measurement rows")
    for opts in data.values():
        opts.sort(key=lambda o: -o[0])
    return data


def check_complete(data: Measurements) -> None:
    """Check that stages are numbered ``0..S-1`` and each has a forward and a backward.

    A backward is either ``backward`` or both halves ``backward_input`` and ``backward_weight``.
    """
    stages = sorted({s for s, _ in data})
    if stages != list(range(len(stages))):
        # The first few gaps, found in O(S log S) however large a stage number is.
        present = set(stages)
        missing = [i for i in range(min(len(stages) + 1, stages[-1])) if i not in present][:10]
        raise ProfileFormatError(
            f"stages must be numbered 0..S-1; stage(s) {missing} missing", field="stage"
        )
    for s in stages:
        has_fwd = (s, "forward") in data
        has_bwd = (s, "backward") in data or (
            (s, "backward_input") in data and (s, "backward_weight") in data
        )
        if not has_fwd or not has_bwd:
            which = "forward" if not has_fwd else "backward"
            raise ProfileFormatError(
                f"stage {s} has no {which} measurements; every stage needs forward and backward",
                field="instruction",
            )


def read_csv(text: str, *, stages: Iterable[int] | None = None) -> Measurements:
    """Validate a whole profile CSV document and return its measurements (see :func:`parse_rows`)."""
    return parse_rows(csv_rows(text), stages=stages)


def load_json(text: str | bytes, *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Parse a JSON profile document with bounded nesting and integer length.

    Linear in the size of ``text``: the depth is measured on the text (strings removed) before
    ``json.loads`` runs, so a deeply nested document never reaches the recursive parser.
    Raises :class:`ProfileFormatError` on invalid JSON, nesting deeper than ``max_depth`` or an
    integer literal longer than :data:`MAX_JSON_INT_DIGITS` digits.
    """
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise ProfileFormatError("the profile is not UTF-8 text") from None
    depth = deepest = 0
    for bracket in _BRACKETS.findall(_STRINGS.sub('""', text)):
        depth += 1 if bracket in "[{" else -1
        if depth > deepest:
            deepest = depth
            if deepest > max_depth:
                raise ProfileFormatError(f"JSON nested deeper than {max_depth} levels")
    try:
        return json.loads(text, parse_int=_bounded_int)
    except ProfileFormatError:
        raise
    except (ValueError, RecursionError) as e:
        raise ProfileFormatError(f"not valid JSON: {e}") from None


_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')
_BRACKETS = re.compile(r"[\[\]{}]")


def _bounded_int(literal: str) -> int:
    if len(literal.lstrip("-")) > MAX_JSON_INT_DIGITS:
        raise ProfileFormatError(f"integer literal of {len(literal)} digits is too long")
    return int(literal)


def as_int(value: Any, name: str, row: int) -> int:
    """``value`` as an integer, or :class:`ProfileFormatError` naming ``name`` and ``row``."""
    if isinstance(value, bool):
        raise ProfileFormatError(f"not a number: {value!r}", field=name, row=row)
    if isinstance(value, int):
        return value
    if isinstance(value, str) and len(value) > MAX_FIELD_CHARS:
        raise ProfileFormatError(f"at most {MAX_FIELD_CHARS} characters", field=name, row=row)
    try:
        f = float(value)
    except (TypeError, ValueError, OverflowError):
        raise ProfileFormatError(f"not a number: {value!r}", field=name, row=row) from None
    if not math.isfinite(f) or f != int(f):
        raise ProfileFormatError(f"must be an integer, got {value!r}", field=name, row=row)
    return int(f)


def as_positive_float(value: Any, name: str, row: int) -> float:
    """``value`` as a finite number > 0, or :class:`ProfileFormatError` naming ``name`` and ``row``."""
    f = _as_finite_float(value, name, row)
    if f <= 0:
        raise ProfileFormatError(f"must be positive, got {value!r}", field=name, row=row)
    return f


def as_nonnegative_float(value: Any, name: str, row: int) -> float:
    """``value`` as a finite number >= 0, or :class:`ProfileFormatError` naming ``name`` and ``row``."""
    f = _as_finite_float(value, name, row)
    if f < 0:
        raise ProfileFormatError(f"must be >= 0, got {value!r}", field=name, row=row)
    return f


def _as_finite_float(value: Any, name: str, row: int) -> float:
    if isinstance(value, bool):
        raise ProfileFormatError(f"not a number: {value!r}", field=name, row=row)
    if isinstance(value, str) and len(value) > MAX_FIELD_CHARS:
        raise ProfileFormatError(f"at most {MAX_FIELD_CHARS} characters", field=name, row=row)
    try:
        f = float(value)
    except (TypeError, ValueError, OverflowError):
        raise ProfileFormatError(f"not a number: {value!r}", field=name, row=row) from None
    if math.isnan(f) or math.isinf(f):
        raise ProfileFormatError(f"must be finite, got {value!r}", field=name, row=row)
    return f
