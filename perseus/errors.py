"""The exception hierarchy of Perseus.

Every error raised on bad input derives from :class:`PerseusError` and from ``ValueError``
(so callers that only know Python's built-ins still catch it), and names the field, row or
option at fault in its message.
"""

from __future__ import annotations

__all__ = [
    "PerseusError",
    "ProfileError",
    "ScheduleError",
    "InfeasibleError",
    "OptionError",
    "SolverCancelled",
]


class PerseusError(Exception):
    """Base class of every error Perseus raises on purpose."""


class ProfileError(PerseusError, ValueError):
    """A profile is malformed or inconsistent.

    Attributes:
        field: the column or key at fault (``"time"``, ``"stage"``...), when there is one.
        row: the 1-based line of the CSV file (header is line 1) or the index of the JSON record.
    """

    def __init__(self, message: str, *, field: str | None = None, row: int | None = None) -> None:
        where = []
        if row is not None:
            where.append(f"row {row}")
        if field is not None:
            where.append(f"field {field!r}")
        prefix = (", ".join(where) + ": ") if where else ""
        super().__init__(prefix + message)
        self.field = field
        self.row = row


class ScheduleError(PerseusError, ValueError):
    """A pipeline schedule is malformed (unknown name, bad sizes, an order that cannot run)."""


class InfeasibleError(PerseusError, ValueError):
    """No plan on the frontier meets the requested deadline, slowdown or energy budget."""


class OptionError(PerseusError, ValueError):
    """An option of a computation is out of range (the message names it).

    Attributes:
        field: the option at fault (``"effort"``...), when there is one.
    """

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class SolverCancelled(PerseusError):
    """The frontier computation was cancelled by its caller."""
