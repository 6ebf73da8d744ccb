"""The gRPC methods are declared once (:mod:`perseus_server.grpc.methods`).

Every method of the ``.proto`` has a declaration, classified for the gate (its rule, and how a
rank credential's requests are checked), and the servicer and the gate are built from those
declarations. A new method fails here until it is declared and classified.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import grpc
import httpx
import pytest

from perseus_common.proto import perseus_pb2 as pb
from perseus_common.proto import perseus_pb2_grpc as pb_grpc
from perseus_server import ServerProcess
from perseus_server.grpc import gate
from perseus_server.grpc.methods import GRPC, METHODS, SERVICE, Method, RankCheck, by_path
from perseus_server.grpc.service import PlanServicer
from perseus_server.service import authorization as authz
from perseus_server.service.credentials import Scope

PROTO_METHODS = [m.name for m in pb.DESCRIPTOR.services_by_name["PlanService"].methods]


def classification_problems(methods: Iterable[Method], proto: list[str]) -> list[str]:
    """What is wrong with ``methods`` as the declarations of the ``proto`` methods."""
    methods = list(methods)
    names = [m.name for m in methods]
    problems = [f"{n}: not declared" for n in proto if n not in names]
    problems += [f"{n}: not in the .proto" for n in names if n not in proto]
    problems += [f"{n}: declared twice" for n in set(names) if names.count(n) > 1]
    for m in methods:
        if set(m.rule) != set(Scope) or m.rule[Scope.ADMIN] is not authz.Access.ANY:
            problems.append(f"{m.name}: its rule does not classify every credential kind")
        if m.rule[Scope.RANK] is authz.Access.OWN and m.rank_check is None:
            problems.append(f"{m.name}: a rank credential's requests are not checked")
        if m.rank_check is not None and m.rule[Scope.RANK] is not authz.Access.OWN:
            problems.append(f"{m.name}: a rank check on a method ranks may not call")
    return problems


def test_every_proto_method_is_declared_and_classified() -> None:
    assert classification_problems(METHODS, PROTO_METHODS) == []
    assert [m.name for m in METHODS] == PROTO_METHODS  # in the .proto's order
    assert dict(GRPC) == {m.name: m.rule for m in METHODS}


def test_the_check_fails_for_an_undeclared_or_unclassified_method() -> None:
    # The check above is not vacuous: a method left out, or declared without the rank check its
    # rule needs, is reported.
    last = METHODS[-1]
    assert classification_problems(METHODS[:-1], PROTO_METHODS) == [f"{last.name}: not declared"]
    unchecked = Method(last.name, last.rule, last.body, rank_check=None, limit=last.limit)
    assert classification_problems([*METHODS[:-1], unchecked], PROTO_METHODS) == [
        f"{last.name}: a rank credential's requests are not checked"
    ]
    extra = Method("Extra", authz.ADMIN_ONLY, last.body)
    assert classification_problems([*METHODS, extra], PROTO_METHODS) == ["Extra: not in the .proto"]


def test_the_servicer_and_the_gate_are_built_from_the_declarations() -> None:
    base = pb_grpc.PlanServiceServicer
    for m in METHODS:
        answer = getattr(PlanServicer, m.name)
        assert answer is not getattr(base, m.name), f"{m.name} is not answered"
        assert answer.__name__ == m.name
        assert by_path(SERVICE + m.name) is m
    assert gate.METHOD_LIMITS == {m.path: m.limit for m in METHODS if m.limit is not None}
    assert gate.METHOD_LIMITS  # the declarations do limit some requests
    assert by_path(SERVICE + "Nope") is None
    assert gate.GRPC_METHODS == set(PROTO_METHODS)


def test_the_rank_checks_cover_every_call_shape_of_the_declarations() -> None:
    # Each declared rank check has a wrapper for the method's call shape (the gate raises for
    # one it cannot check rather than letting it through).
    shapes = {
        d.name: (d.client_streaming, d.server_streaming)
        for d in pb.DESCRIPTOR.services_by_name["PlanService"].methods
    }
    for m in METHODS:
        if m.rank_check is RankCheck.REGISTER:
            assert shapes[m.name] == (False, False), m.name
        elif m.rank_check is RankCheck.RANK:
            assert shapes[m.name] != (True, True), m.name


ADMIN = "the-admin-token"


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    d = tmp_path_factory.mktemp("grpc-methods")
    with ServerProcess(d / "perseus.db", token=ADMIN) as s:
        yield s


def test_a_method_not_declared_is_the_admins_only(srv: ServerProcess) -> None:
    """A method of the service that has no declaration opens to the admin only.

    A credential other than the admin's is refused by the gate (PERMISSION_DENIED); the admin's
    reaches the server, which does not implement it (UNIMPLEMENTED).
    """
    with httpx.Client(base_url=srv.http_url, timeout=30.0) as c:
        r = c.post(
            "/jobs",
            json={"stages": 2, "microbatches": 2, "blocking_power": 70.0},
            headers={"Authorization": f"Bearer {ADMIN}"},
        )
        assert r.status_code == 201, r.text
        rank_token = r.json()["rank_credential"]
    with grpc.insecure_channel(srv.grpc_target) as ch:
        call = ch.unary_unary(SERVICE + "Undeclared", lambda b: b, lambda b: b)
        codes = {}
        for who, token in (("rank", rank_token), ("admin", ADMIN)):
            try:
                call(b"", metadata=(("authorization", f"Bearer {token}"),), timeout=10)
                codes[who] = grpc.StatusCode.OK
            except grpc.RpcError as e:
                codes[who] = e.code()
    assert codes == {
        "rank": grpc.StatusCode.PERMISSION_DENIED,
        "admin": grpc.StatusCode.UNIMPLEMENTED,
    }
