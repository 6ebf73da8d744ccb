"""``perseus_common.located_error``: an error that says where in the input it is."""

from __future__ import annotations

import pytest

from perseus_common.located_error import LocatedError


@pytest.mark.parametrize(
    ("field", "row", "text"),
    [
        ("time", 3, "row 3, field 'time': must be > 0"),
        (None, 3, "row 3: must be > 0"),
        ("time", None, "field 'time': must be > 0"),
        (None, None, "must be > 0"),
    ],
)
def test_the_message_names_the_place_and_keeps_it_apart(
    field: str | None, row: int | None, text: str
) -> None:
    e = LocatedError("must be > 0", field=field, row=row)
    assert str(e) == text
    assert (e.detail, e.field, e.row) == ("must be > 0", field, row)


def test_it_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="row 0"):  # a JSON record's index may be 0
        raise LocatedError("bad", row=0)
