"""No function over :data:`MAX_LINES` lines, checked with :mod:`ast` over every package.

See ``docs/architecture.md``, "Style". The numba kernels (flat loops over arrays, one per algorithm)
are the documented exception. A function's docstring is not counted: ruff's D rules require one on
every public function, and the limit is on code.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 120
#: Every package of the project is held to the limit.
PACKAGES = ("perseus", "server", "client", "gpud", "common", "demo")
#: Folders left out: the numba kernels.
EXEMPT = ("perseus/kernels",)


def long_functions(package: Path, root: Path = ROOT, exempt: tuple[str, ...] = EXEMPT) -> list[str]:
    """``path:line name (n lines)`` of every function or method over the limit.

    Outside the ``exempt`` folders (relative to ``root``).
    """
    found = []
    skip = [root / e for e in exempt]
    for path in sorted(package.rglob("*.py")):
        if "_pb2" in path.name or any(path.is_relative_to(d) for d in skip):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = (node.end_lineno or node.lineno) - node.lineno + 1 - _docstring_lines(node)
                if n > MAX_LINES:
                    rel = path.relative_to(root)
                    found.append(f"{rel}:{node.lineno} {node.name} ({n} lines)")
    return found


def _docstring_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """How many lines the function's docstring takes (0 without one)."""
    first = node.body[0]
    value = first.value if isinstance(first, ast.Expr) else None
    if isinstance(value, ast.Constant) and isinstance(value.value, str):
        return (first.end_lineno or first.lineno) - first.lineno + 1
    return 0


@pytest.mark.parametrize("package", PACKAGES)
def test_no_function_is_over_the_limit(package: str) -> None:
    assert long_functions(ROOT / package) == []


def test_the_check_sees_a_long_function(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    (tmp_path / "long.py").write_text(f"def long() -> None:\n{body}\n")
    assert long_functions(tmp_path, tmp_path) == [f"long.py:1 long ({MAX_LINES + 1} lines)"]


def test_the_check_leaves_out_the_exempt_folders(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "long.py").write_text(f"def long() -> None:\n{body}\n")
    assert long_functions(tmp_path, tmp_path, exempt=("kernels",)) == []
    assert long_functions(tmp_path, tmp_path, exempt=()) == [
        f"kernels/long.py:1 long ({MAX_LINES + 1} lines)"
    ]


def test_the_check_does_not_count_the_docstring(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES - 1))
    doc = '    """Summary.\n\n    Body.\n    """\n'
    (tmp_path / "doc.py").write_text(f"def fits() -> None:\n{doc}{body}\n")
    assert long_functions(tmp_path, tmp_path) == []
    (tmp_path / "doc.py").write_text(f"def fits() -> None:\n{doc}{body}\n    x = 0\n")
    assert long_functions(tmp_path, tmp_path) == [f"doc.py:1 fits ({MAX_LINES + 1} lines)"]
