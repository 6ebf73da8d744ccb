"""The exception hierarchy of Perseus.

Every error raised on bad input derives from :class:`PerseusError` and from ``ValueError``
(so callers that only know Python's built-ins still catch it), and names the field, row or
option at fault in its message.
"""

from __future__ import annotations

from perseus_common.located_error import LocatedError

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


class ProfileError(PerseusError, LocatedError):
    """A profile is malformed or inconsistent.

    For ``detail``, ``field`` and ``row`` see :class:`~perseus_common.located_error.LocatedError`, the
    constructor it shares with the common reader's
    :class:`~perseus_common.profile_csv.ProfileFormatError`.
    """


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
