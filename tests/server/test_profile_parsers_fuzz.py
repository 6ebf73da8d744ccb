"""Hypothesis on the profile parsers the server runs on uploads.

Arbitrary bytes only ever raise :class:`ProfileFormatError` (a 422), never another exception (a
500).
"""

from __future__ import annotations

import contextlib

from hypothesis import given, settings
from hypothesis import strategies as st

from perseus.errors import ProfileError
from perseus.profiles import parse_profile_csv, parse_profile_json
from perseus_common.profile_csv import COLUMNS, ProfileFormatError, load_json, read_csv

HEADER = ",".join(COLUMNS) + "\n"
_csvish = st.text(alphabet=st.sampled_from(list('0123456789.,-e"\r\n\x00 forwadbckinpuE+')))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2000) | _csvish.map(lambda t: (HEADER + t).encode()))
def test_csv_parser_on_arbitrary_bytes(data: bytes) -> None:
    text = data.decode("utf-8", errors="replace")
    for parse in (read_csv, parse_profile_csv):
        with contextlib.suppress(ProfileFormatError, ProfileError):
            parse(text)


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=12), kids),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2000) | st.text(alphabet='[]{}",:0123456789e.-').map(str.encode))
def test_json_loader_on_arbitrary_bytes(data: bytes) -> None:
    try:
        obj = load_json(data)
    except ProfileFormatError:
        return
    with contextlib.suppress(ProfileError):
        parse_profile_json(obj)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.fixed_dictionaries(
            {
                "stage": _json | st.integers(-5, 5),
                "instruction": _json | st.sampled_from(["forward", "backward"]),
                "frequency": _json | st.integers(),
                "time": _json,
                "energy": _json,
            }
        ),
        max_size=6,
    )
)
def test_json_records_of_any_type(records: list[dict[str, object]]) -> None:
    with contextlib.suppress(ProfileError):
        parse_profile_json({"records": records})


def test_depth_is_bounded_before_parsing() -> None:
    import pytest

    with pytest.raises(ProfileFormatError, match="nested deeper"):
        load_json("[" * 1_000_000 + "]" * 1_000_000)
    with pytest.raises(ProfileFormatError, match="digits"):
        load_json("[" + "1" * 10_000 + "]")
    # Brackets inside strings do not count.
    assert load_json('["[[[[[[[[[[[[[[["]') == ["[[[[[[[[[[[[[[["]
