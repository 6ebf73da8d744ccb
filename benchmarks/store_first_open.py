"""A process's first store on a new database: the schema written directly against the history.

Each sample is a new Python process (as every ``perseus serve`` is) that opens a store on a new
database, one way or the other, interleaved so both see the same machine:

- ``direct``: ``SqlStore.open`` as the server does it now (a database holding no table gets the
  head's schema written directly, ``perseus_server/runtime/schema/fresh.py``);
- ``history``: what a first open did before: Alembic's ``upgrade head`` on the new database
  (``schema.migrate``, loading Alembic and SQLAlchemy), then ``SqlStore.open``;
- ``at_head``: ``SqlStore.open`` on a database already at the head (the usual restart).

Each child times its own open, from before importing the store to the store open (its
``open_s``), and the parent times the whole process (``process_s``). Prints a table, or JSON
with ``--json``; medians over ``--samples`` (``--smoke``: 2). PostgreSQL too when installed
(``--postgres``; a throwaway server, one new database per sample).

    python benchmarks/store_first_open.py --samples 15
    python benchmarks/store_first_open.py --postgres --json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

_CHILD = """
import sys, time
t0 = time.perf_counter()
mode, target = sys.argv[1], sys.argv[2]
from perseus_server.runtime.sql_store import SqlStore
if mode == "history":
    from perseus_server.runtime import schema
    from perseus_server.runtime.stores import engine_for
    engine = engine_for(target, pool_size=1)
    schema.migrate(engine)
    engine.dispose()
SqlStore.open(target).close()
print(time.perf_counter() - t0)
"""

MODES = ("direct", "history", "at_head")


def _sample(mode: str, target: str) -> tuple[float, float]:
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, mode, target], check=True, capture_output=True, text=True
    ).stdout
    return float(out.strip().splitlines()[-1]), time.perf_counter() - start


def measure(samples: int, new_target: Any) -> dict[str, dict[str, float]]:
    """Median ``open_s`` and ``process_s`` per mode; ``new_target(i)``: a new database's URL."""
    got: dict[str, list[tuple[float, float]]] = {m: [] for m in MODES}
    for i in range(samples):
        for mode in MODES:
            target = new_target(f"{mode}{i}")
            if mode == "at_head":
                _sample("direct", target)
            got[mode].append(_sample(mode, target))
    return {
        m: {
            "open_s": statistics.median(s[0] for s in got[m]),
            "process_s": statistics.median(s[1] for s in got[m]),
        }
        for m in MODES
    }


def run(samples: int, postgres: bool) -> dict[str, Any]:
    """Both databases' figures (PostgreSQL when asked and installed)."""
    res: dict[str, Any] = {"samples": samples}
    with tempfile.TemporaryDirectory() as tmp:
        res["sqlite"] = measure(samples, lambda name: str(Path(tmp) / f"{name}.db"))
    if postgres:
        from perseus_server.testing.postgres import PostgresServer, postgres_binaries

        if postgres_binaries() is None:
            res["postgresql"] = "skipped: PostgreSQL is not installed"
        else:
            with PostgresServer() as pg:
                res["postgresql"] = measure(samples, pg.create_database)
    for kind in ("sqlite", "postgresql"):
        rows = res.get(kind)
        if isinstance(rows, dict):
            rows["history_over_direct"] = {
                k: rows["history"][k] / rows["direct"][k] for k in ("open_s", "process_s")
            }
    return res


def _table(res: dict[str, Any]) -> str:
    lines = [f"medians over {res['samples']} samples", "| database | mode | open s | process s |"]
    lines.append("|---|---|---|---|")
    for kind in ("sqlite", "postgresql"):
        rows = res.get(kind)
        if not isinstance(rows, dict):
            continue
        for mode in MODES:
            r = rows[mode]
            lines.append(f"| {kind} | {mode} | {r['open_s']:.3f} | {r['process_s']:.3f} |")
        ratio = rows["history_over_direct"]
        lines.append(
            f"| {kind} | history / direct | {ratio['open_s']:.1f}x | {ratio['process_s']:.1f}x |"
        )
    return "\n".join(lines)


def main() -> None:
    """Parse the arguments, measure, print."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=15)
    ap.add_argument("--postgres", action="store_true", help="PostgreSQL too (a throwaway server)")
    ap.add_argument("--smoke", action="store_true", help="2 samples (the suite's check)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    res = run(2 if args.smoke else args.samples, args.postgres)
    print(json.dumps(res, indent=2) if args.json else _table(res))


if __name__ == "__main__":
    main()
