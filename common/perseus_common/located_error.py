"""The one constructor of errors that point at a place in an input (a profile's row and field).

:class:`LocatedError` formats ``row 3, field 'time': must be > 0`` from the message and the
location, and keeps both apart (``detail``, ``field``, ``row``) for callers that report them as
structured fields (the server's problem documents). The common reader's
:class:`~perseus_common.profile_csv.ProfileFormatError` and the core's
:class:`~perseus.errors.ProfileError` both derive from it.
"""

from __future__ import annotations

__all__ = ["LocatedError"]


class LocatedError(ValueError):
    """Bad input at a known place.

    Attributes:
        detail: what is wrong, without the location.
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
        self.detail = message
        self.field = field
        self.row = row
