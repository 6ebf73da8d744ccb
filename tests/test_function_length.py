"""No function over :data:`MAX_LINES` lines (``docs/architecture.md``, "Style"), checked with
:mod:`ast` over the packages that hold to it; the numba kernels (flat loops over arrays, one
per algorithm) are the documented exception."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 120
#: The packages held to the limit (the others are being brought under it).
PACKAGES = ("server/perseus_server", "common/perseus_common")


def long_functions(package: Path, root: Path = ROOT) -> list[str]:
    """``path:line name (n lines)`` of every function or method over the limit."""
    found = []
    for path in sorted(package.rglob("*.py")):
        if "_pb2" in path.name:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > MAX_LINES:
                    rel = path.relative_to(root)
                    found.append(f"{rel}:{node.lineno} {node.name} ({n} lines)")
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_no_function_is_over_the_limit(package: str) -> None:
    assert long_functions(ROOT / package) == []


def test_the_check_sees_a_long_function(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    (tmp_path / "long.py").write_text(f"def long() -> None:\n{body}\n")
    assert long_functions(tmp_path, tmp_path) == [f"long.py:1 long ({MAX_LINES + 1} lines)"]
