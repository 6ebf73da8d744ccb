"""The frontier's PNG drawing (``perseus.plot.frontier_png``).

Drawn from a real frontier's JSON document: a PNG of the documented size, whose pixels change
with the marked points and the title, and a document without points refused.
"""

from __future__ import annotations

import struct
import zlib

import pytest
from solver_instances import knapsack_problem

from perseus.plot import frontier_png
from perseus.solver import solve_problem


def png_size(png: bytes) -> tuple[int, int]:
    """(width, height) of a PNG, read from its IHDR chunk (whose checksum must hold)."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    length, kind = struct.unpack(">I4s", png[8:16])
    assert kind == b"IHDR" and length == 13
    chunk = png[12 : 16 + length]
    assert struct.unpack(">I", png[16 + length : 20 + length])[0] == zlib.crc32(chunk)
    return struct.unpack(">II", png[16:24])


@pytest.fixture(scope="module")
def doc() -> dict:
    return solve_problem(knapsack_problem()).to_json()


def test_a_frontier_is_drawn_as_a_png_of_its_figure_size(doc: dict) -> None:
    png = frontier_png(doc)
    assert png_size(png) == (825, 528)  # 7.5 x 4.8 inches at 110 dpi
    assert frontier_png(doc) == png  # no global state: the same document, the same bytes


def test_marked_points_and_the_title_are_drawn(doc: dict) -> None:
    plain = frontier_png(doc)
    marked = frontier_png(doc, marked=[(1, "the policy's point")])
    titled = frontier_png(doc, title="another title")
    assert len({plain, marked, titled}) == 3
    assert png_size(marked) == png_size(titled) == png_size(plain)


def test_a_marked_point_past_the_frontier_is_an_index_error(doc: dict) -> None:
    with pytest.raises(IndexError):
        frontier_png(doc, marked=[(len(doc["points"]), "nowhere")])
