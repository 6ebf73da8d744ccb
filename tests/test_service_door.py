"""The service's facade is the adapters' one door.

The REST routes (``perseus_server.rest``) and the gRPC methods (``perseus_server.grpc``) call
:class:`~perseus_server.service.PerseusService`'s methods, never a part of the service or the
store behind it (docs/architecture.md, "The facade"). Read from every adapter module with
:mod:`ast`:

- on the service (a name ``service``, or an attribute ``.service`` such as
  ``self.service`` / ``servicer.service``), only the facade's public methods, and the
  settings and instruments the gates use to count and pace requests (:data:`INSTRUMENTS`);
- no attribute ``store``, ``ctx`` or ``transaction`` on anything: the store is the service's;
- no import of the store (:data:`STORE_MODULES`) or of a class the facade builds as one of
  its parts (found by building a facade and looking at what it holds).

Values, errors and pure decisions the service modules define (the authorization table, a
credential's scope, the status page's limits) may be imported: they hold no state.
"""

from __future__ import annotations

import ast
import inspect
from dataclasses import dataclass
from pathlib import Path

import pytest

from perseus_server.config import Limits
from perseus_server.runtime.sql_store import SqlStore
from perseus_server.service import PerseusService

ROOT = Path(__file__).resolve().parent.parent
SERVER = ROOT / "server" / "perseus_server"
ADAPTERS = (SERVER / "rest", SERVER / "grpc")

#: What the adapters' gates read of the service besides its methods: its settings (``limits``),
#: the metrics they count requests into and each tenant's write pacing. Not operations.
INSTRUMENTS = frozenset({"limits", "metrics", "write_limits"})
#: Attributes that reach into the store, whatever object they are read from.
STORE_ATTRIBUTES = frozenset({"store", "ctx", "transaction"})
#: The store's modules (its protocol and its implementations).
STORE_MODULES = (
    "perseus_server.domain.store",
    "perseus_server.runtime.sql_store",
    "perseus_server.runtime.sql_history",
    "perseus_server.runtime.sql_connection",
    "perseus_server.runtime.stores",
    "perseus_server.runtime.schema",
)


@dataclass(frozen=True)
class Reach:
    """One place where an adapter reaches past the facade."""

    path: Path
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.what}"


def facade_methods() -> frozenset[str]:
    """The public methods (and properties) of the facade, its base classes' included."""
    return frozenset(
        name
        for name, value in inspect.getmembers(PerseusService)
        if not name.startswith("_") and (callable(value) or isinstance(value, property))
    )


def part_classes(tmp: Path) -> frozenset[str]:
    """The names of the classes whose instances a built facade holds (its parts).

    The instruments' classes are left out (the gates take them as dependencies).
    """
    store = SqlStore.open(tmp / "door.db")
    try:
        service = PerseusService(store, Limits())
        held = {
            type(value).__name__
            for name, value in vars(service).items()
            if name not in INSTRUMENTS and type(value).__module__.startswith("perseus_server.")
        }
    finally:
        store.close()
    return frozenset(held)


def _is_service(node: ast.expr) -> bool:
    """Whether ``node`` names the service: ``service`` or ``<anything>.service``."""
    if isinstance(node, ast.Name):
        return node.id == "service"
    return isinstance(node, ast.Attribute) and node.attr == "service"


def reaches(path: Path, source: str, methods: frozenset[str], parts: frozenset[str]) -> list[Reach]:
    """Every place in ``source`` that reaches past the facade (see the module docstring)."""
    found: list[Reach] = []
    for node in ast.walk(ast.parse(source, filename=str(path))):
        if isinstance(node, ast.Attribute):
            if node.attr in STORE_ATTRIBUTES:
                found.append(Reach(path, node.lineno, f".{node.attr} (the store)"))
            elif _is_service(node.value) and node.attr not in methods | INSTRUMENTS:
                found.append(Reach(path, node.lineno, f"service.{node.attr} (not a facade method)"))
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith(STORE_MODULES):
                found.append(Reach(path, node.lineno, f"imports {node.module} (the store)"))
            elif node.module.startswith("perseus_server."):
                for alias in node.names:
                    if alias.name in parts:
                        found.append(
                            Reach(
                                path, node.lineno, f"imports {alias.name} (a part of the service)"
                            )
                        )
        elif isinstance(node, ast.Import):
            found.extend(
                Reach(path, node.lineno, f"imports {a.name} (the store)")
                for a in node.names
                if a.name.startswith(STORE_MODULES)
            )
    return sorted(found, key=lambda r: (r.line, r.what))


@pytest.fixture(scope="module")
def parts(tmp_path_factory: pytest.TempPathFactory) -> frozenset[str]:
    return part_classes(tmp_path_factory.mktemp("door"))


def test_the_scanner_sees_each_way_past_the_facade(parts: frozenset[str]) -> None:
    """Each kind of reach is found (as the adapters had them), and facade calls are not."""
    assert {"Solves", "Tenants", "Registration", "PowerBudget"} <= parts, parts
    source = (
        "from perseus_server.runtime.sql_store import SqlStore\n"
        "import perseus_server.domain.store\n"
        "from perseus_server.service.solves import Solves\n"
        "def route(service, servicer, credentials):\n"
        "    with service.store.transaction():\n"
        "        service.solves.start('j')\n"
        "    servicer.service.registration.register(None)\n"
        "    credentials.store\n"
        "    service.query_plan('j', None)\n"
        "    service.metrics.render()\n"
    )
    found = reaches(Path("x.py"), source, facade_methods(), parts)
    assert [(r.line, r.what.split(" ")[0]) for r in found] == [
        (1, "imports"),
        (2, "imports"),
        (3, "imports"),
        (5, ".store"),
        (5, ".transaction"),
        (6, "service.solves"),
        (7, "service.registration"),
        (8, ".store"),
    ], [str(r) for r in found]


def test_no_adapter_reaches_past_the_facade(parts: frozenset[str]) -> None:
    """No REST route or gRPC method calls a part of the service or the store."""
    methods = facade_methods()
    found = [
        str(r)
        for root in ADAPTERS
        for path in sorted(root.rglob("*.py"))
        if not path.name.endswith(("_pb2.py", "_pb2_grpc.py"))
        for r in reaches(path.relative_to(ROOT), path.read_text(), methods, parts)
    ]
    assert not found, "adapters reaching past the facade:\n" + "\n".join(found)
