"""Compact encodings of a frontier's plans.

What ``perseus frontier --plans`` writes and the server stores.

A frontier's plans are a ``(k, n)`` ``uint8`` array (one option index per DAG node and point).
Neighbouring points share most of their clocks (A100 tiled 32 x 64: 6 % of the instructions
change from one point to the next), so each row is stored as its XOR with the row before it,
zlib-compressed and base64-encoded: 219 MB of per-instruction JSON objects became 0.24 MB.

Two forms:

* **stored** (:func:`encode_rows` / :func:`decode_rows`): the option indices of every node, one
  blob for the whole array (``Frontier.to_json(compact=True)``'s ``plans_z``).
* **per-rank clocks** (:func:`encode_rank_plans` / :func:`decode_rank_plans`, the ``--plans``
  JSON): the document's ``plan_encoding`` holds, once, each rank's instructions in execution
  order (``[instruction, microbatch, model stage]``) and its clock table (MHz, descending); each
  point's ``plan`` is one string: the points' clock-table indices of every rank's
  instructions, ranks one after the other, XOR the previous point's, zlib, base64. A reader
  decodes the points in order. :func:`decode_rank_plans` also reads the old form (``plan`` a
  list per rank of ``{instruction, microbatch, frequency}``).
"""

from __future__ import annotations

import base64
import zlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = [
    "RANK_CLOCKS_FORMAT",
    "encode_rows",
    "decode_rows",
    "encode_rank_plans",
    "decode_rank_plans",
    "rank_steps",
]

#: ``plan_encoding["format"]`` of the per-rank clock form.
RANK_CLOCKS_FORMAT = "rank-clock-index-xor-zlib-base64/1"

PlanArray = npt.NDArray[np.uint8]


def _b64z(data: bytes) -> str:
    return base64.b64encode(zlib.compress(data, 6)).decode()


def _unb64z(text: str) -> bytes:
    return zlib.decompress(base64.b64decode(text))


def encode_rows(plans: PlanArray) -> str:
    """The whole ``(k, n)`` array as one string (rows XOR their predecessor, zlib, base64)."""
    a = np.ascontiguousarray(plans, dtype=np.uint8)
    delta = a.copy()
    delta[1:] ^= a[:-1]
    return _b64z(delta.tobytes())


def decode_rows(text: str, shape: Sequence[int]) -> PlanArray:
    """The array :func:`encode_rows` wrote, of ``shape``."""
    k, n = int(shape[0]), int(shape[1])
    raw = np.frombuffer(_unb64z(text), dtype=np.uint8)
    if raw.size != k * n:
        raise ValueError(f"plans: {raw.size} bytes for shape {k} x {n}")
    out = raw.reshape(k, n).copy()
    np.bitwise_xor.accumulate(out, axis=0, out=out)
    return out


def encode_rank_plans(
    orders: Sequence[Sequence[tuple[str, int, int]]],
    op_freqs: npt.NDArray[np.int64],
    plans: PlanArray,
) -> tuple[dict[str, Any], list[str]]:
    """Encode plans per rank: ``(plan_encoding, one string per point)``.

    ``op_freqs`` is ``(num_ops, K)``, the MHz of every op's options, ops in rank order (the
    ranks' ``orders`` one after the other); ``plans`` ``(k, >= num_ops)`` option indices. A
    rank's clock table holds every clock its ops have. Memory: one row at a time, besides the
    strings.
    """
    clocks: list[list[int]] = []
    lookup = np.empty(op_freqs.shape, dtype=np.int64)  # option -> index in its rank's table
    at = 0
    for order in orders:
        block = op_freqs[at : at + len(order)]
        ascending = np.unique(block)
        clocks.append([int(f) for f in ascending[::-1]])
        lookup[at : at + len(order)] = len(ascending) - 1 - np.searchsorted(ascending, block)
        at += len(order)
    wide = max((len(c) for c in clocks), default=0) > 256
    table = lookup.astype("<u2" if wide else "u1")
    rows = np.arange(at)
    prev = np.zeros(at, dtype=table.dtype)
    points = []
    for plan in plans:
        row = table[rows, plan[:at].astype(np.int64)]
        points.append(_b64z((row ^ prev).tobytes()))
        prev = row
    enc = {
        "format": RANK_CLOCKS_FORMAT,
        "dtype": "uint16" if wide else "uint8",
        "orders": [[[k, m, s] for k, m, s in o] for o in orders],
        "clocks": clocks,
    }
    return enc, points


def _iter_rank_freqs(doc: Mapping[str, Any]) -> Iterator[list[list[int]]]:
    enc = doc["plan_encoding"]
    if enc.get("format") != RANK_CLOCKS_FORMAT:
        raise ValueError(f"plan_encoding: unknown format {enc.get('format')!r}")
    dtype = np.dtype("<u2" if enc.get("dtype") == "uint16" else "u1")
    sizes = [len(o) for o in enc["orders"]]
    tables = [np.asarray(c, dtype=np.int64) for c in enc["clocks"]]
    prev = np.zeros(sum(sizes), dtype=dtype)
    for p in doc["points"]:
        row = np.frombuffer(_unb64z(p["plan"]), dtype=dtype) ^ prev
        if row.size != prev.size:
            raise ValueError(f"plan: {row.size} instructions, the orders hold {prev.size}")
        prev = row
        out, at = [], 0
        for size, table in zip(sizes, tables, strict=True):
            out.append(table[row[at : at + size].astype(np.int64)].tolist())
            at += size
        yield out


def decode_rank_plans(doc: Mapping[str, Any]) -> Iterator[list[list[dict[str, Any]]]]:
    """Every point's plan of a ``--plans`` document, in order, as one list per rank.

    Each list holds ``{instruction, microbatch, stage, frequency}`` in execution order (the old
    form, a list per rank of ``{instruction, microbatch, frequency}``, is passed through as it
    was written).
    """
    if "plan_encoding" not in doc:
        for p in doc["points"]:
            yield p["plan"]
        return
    orders = doc["plan_encoding"]["orders"]
    for freqs in _iter_rank_freqs(doc):
        yield _steps(orders, freqs)


def rank_steps(doc: Mapping[str, Any], index: int) -> list[list[dict[str, Any]]]:
    """Point ``index``'s plan of a ``--plans`` document (either form), per rank."""
    if not 0 <= index < len(doc["points"]):
        raise IndexError(f"point {index} of {len(doc['points'])}")
    if "plan_encoding" not in doc:
        return list(doc["points"][index]["plan"])
    orders = doc["plan_encoding"]["orders"]
    for i, freqs in enumerate(_iter_rank_freqs(doc)):
        if i == index:
            return _steps(orders, freqs)
    raise IndexError(index)  # pragma: no cover


def _steps(orders: Sequence[Sequence[Any]], freqs: list[list[int]]) -> list[list[dict[str, Any]]]:
    return [
        [
            {"instruction": k, "microbatch": m, "stage": s, "frequency": f}
            for (k, m, s), f in zip(order, fr, strict=True)
        ]
        for order, fr in zip(orders, freqs, strict=True)
    ]
