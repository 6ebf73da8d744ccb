"""`docs/architecture.md` and the server's tree stay in step.

Every module of ``server/perseus_server/`` is in the doc's module table, and every module the table
names exists.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SERVER = ROOT / "server" / "perseus_server"
DOC = ROOT / "docs" / "architecture.md"


def _table_modules() -> set[str]:
    text = DOC.read_text()
    section = text.split("## The server's tree", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return {re.match(r"\| `([^`]+)`", row).group(1) for row in rows}  # type: ignore[union-attr]


def _tree_modules() -> set[str]:
    """Every module, but a group's own ``__init__.py`` (the group is described in the list)."""
    mods = set()
    for path in SERVER.rglob("*.py"):
        rel = path.relative_to(SERVER).as_posix()
        if rel.endswith("/__init__.py"):
            continue
        mods.add(rel)
    return mods


def test_every_server_module_is_in_the_architecture_table() -> None:
    missing = _tree_modules() - _table_modules()
    assert not missing, f"add these to docs/architecture.md, 'The server's tree': {sorted(missing)}"


def test_every_module_the_table_names_exists() -> None:
    stale = _table_modules() - _tree_modules()
    assert not stale, f"docs/architecture.md names modules that are gone: {sorted(stale)}"


def test_the_table_reader_sees_rows() -> None:
    # A broken reader (a renamed heading, another row format) must not pass vacuously.
    assert {"service/facade.py", "runtime/sql_store.py", "grpc/service.py"} <= _table_modules()
