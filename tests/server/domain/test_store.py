"""``domain/store.py``: the :class:`Store` protocol, the service's one view of its persistence.

The protocol is what callers need and no more: the one implementation (``SqlStore``, SQLite and
PostgreSQL) takes each method exactly as the protocol writes it, and the service calls each. What
each method does is the contract suite's (``tests/server/runtime/test_sql_store_contract.py``,
against both databases).
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from perseus_server.domain.store import Store, StoreError
from perseus_server.runtime.sql_store import SqlStore

SERVER = Path(__file__).resolve().parents[3] / "server" / "perseus_server"
METHODS = sorted(n for n, v in vars(Store).items() if not n.startswith("_") and callable(v))


def _parameters(fn: object) -> list[tuple[str, object, object]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]  # type: ignore[arg-type]


def test_the_protocol_has_the_methods_the_docs_name() -> None:
    assert {"transaction", "after_commit", "jobs", "credentials", "tenants", "ranks"} <= set(
        METHODS
    )
    assert issubclass(StoreError, RuntimeError)


@pytest.mark.parametrize("name", METHODS)
def test_the_sql_store_takes_each_method_as_the_protocol_writes_it(name: str) -> None:
    assert _parameters(getattr(SqlStore, name)) == _parameters(getattr(Store, name))


def test_the_service_calls_every_method_of_the_protocol() -> None:
    # Narrowed to what callers need: a method nothing calls is dropped from the protocol.
    callers = [*(SERVER / "service").rglob("*.py"), SERVER / "server.py"]
    source = "\n".join(p.read_text() for p in callers)
    unused = [n for n in METHODS if not re.search(rf"\.{n}\(", source)]
    assert not unused, f"the Store protocol has methods no caller uses: {unused}"
