"""The server addresses a rank is given, checked, and the order it tries them in.

Several (a comma-separated string or a list), TLS per address, a DNS name with several addresses
counted as several (through an injected resolver), bad input named by position and reason, and the
order a rank tries them in (the leader a standby names first). One real check: a name whose first
address refuses reaches the server at its second.
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from perseus_client import PerseusClient, SimulatedGpu
from perseus_client.addresses import (
    Endpoint,
    Route,
    ServerAddress,
    parse_servers,
    system_resolver,
)
from perseus_client.errors import ConfigError
from perseus_client.transport import ServerLink
from perseus_common.wire.values import RankRegistration
from perseus_server import ServerProcess


def test_several_addresses_from_a_comma_string_or_a_list() -> None:
    want = (ServerAddress("a.example:50051", False), ServerAddress("b.example:50052", False))
    assert parse_servers("a.example:50051,b.example:50052") == want
    assert parse_servers(" a.example:50051 , b.example:50052 ") == want
    assert parse_servers(["a.example:50051", "b.example:50052"]) == want
    assert parse_servers("a.example:50051,a.example:50051") == want[:1]  # each once


def test_tls_is_chosen_per_address() -> None:
    got = parse_servers("grpcs://a.example:443,grpc://b.example:50051,c.example:50051")
    assert [(x.target, x.tls) for x in got] == [
        ("a.example:443", True),
        ("b.example:50051", False),
        ("c.example:50051", False),
    ]
    # A CA configured: TLS for every address that does not say grpc://.
    got = parse_servers("grpc://b.example:50051,c.example:50051,[::1]:7", tls_default=True)
    assert [(x.target, x.tls) for x in got] == [
        ("b.example:50051", False),
        ("c.example:50051", True),
        ("[::1]:7", True),
    ]


@pytest.mark.parametrize(
    ("server", "where", "why"),
    [
        ("a:1,,b:2", "address 2 of 3", "empty"),
        ("a:1,b:99999", "address 2 of 2, 'b:99999'", "port '99999'"),
        ("a:1,b", "address 2 of 2, 'b'", "no port"),
        ("::1:50051", "the address, '::1:50051'", "IPv6 address needs brackets"),
        ("a:1,grpcs://x y:5", "address 2 of 2", "not a host name"),
        ("", "no server address", ""),
        (" , ", "no server address", ""),
    ],
)
def test_a_bad_address_is_named_with_why(server: str, where: str, why: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_servers(server)
    assert e.value.field == "server"
    assert where in str(e.value) and why in str(e.value)


def test_a_list_item_that_is_not_a_string_is_named() -> None:
    with pytest.raises(ConfigError, match="address 2 is not a string"):
        parse_servers(["a:1", 50051])  # type: ignore[list-item]


def test_the_client_takes_several_addresses_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, sim_gpu: SimulatedGpu
) -> None:
    monkeypatch.setenv("PERSEUS_SERVER", "127.0.0.1:1,grpc://127.0.0.2:2")
    client = PerseusClient(job="j", gpu=sim_gpu, handle_signals=False)
    try:
        assert client.link.route.addresses == (
            ServerAddress("127.0.0.1:1", False),
            ServerAddress("127.0.0.2:2", False),
        )
    finally:
        client.close()
    monkeypatch.setenv("PERSEUS_SERVER", "127.0.0.1:1,127.0.0.1:x")
    with pytest.raises(ConfigError, match=r"address 2 of 2, '127.0.0.1:x'"):
        PerseusClient(job="j", gpu=sim_gpu, handle_signals=False)


class _Resolver:
    """A DNS of the test's own: ``answers[name]`` (an OSError for a name it does not know)."""

    def __init__(self, answers: dict[str, list[str]]) -> None:
        self.answers = answers
        self.asked: list[tuple[str, int]] = []

    def __call__(self, host: str, port: int) -> list[str]:
        self.asked.append((host, port))
        if host not in self.answers:
            raise OSError(f"{host}: name not known")
        return self.answers[host]


def test_a_name_with_several_addresses_counts_as_several() -> None:
    dns = _Resolver({"pair.example": ["10.0.0.1", "10.0.0.2"], "one.example": ["10.0.0.9"]})
    route = Route(
        parse_servers("pair.example:50051,one.example:50051,ghost.example:7,10.1.1.1:9"), dns
    )
    seen = [route.current] + [route.advance() for _ in range(route.size - 1)]
    assert seen == [
        Endpoint("10.0.0.1:50051", False, "pair.example:50051"),
        Endpoint("10.0.0.2:50051", False, "pair.example:50051"),
        Endpoint("one.example:50051", False),  # one address: gRPC resolves it
        Endpoint("ghost.example:7", False),  # not resolved now: kept, gRPC says why
        Endpoint("10.1.1.1:9", False),  # an address is not looked up
    ]
    assert ("10.1.1.1", 9) not in dns.asked
    # Past the end the names are resolved again: a changed record is followed.
    dns.answers["pair.example"] = ["10.0.0.3", "10.0.0.1", "10.0.0.3"]
    assert route.advance() == Endpoint("10.0.0.3:50051", False, "pair.example:50051")
    assert route.advance() == Endpoint("10.0.0.1:50051", False, "pair.example:50051")
    assert route.advance() == Endpoint("one.example:50051", False)


def test_the_leader_a_standby_names_is_tried_next() -> None:
    dns = _Resolver({"pair.example": ["10.0.0.1", "10.0.0.2"]})
    route = Route(parse_servers("a.example:1,b.example:2,pair.example:3,grpcs://c.example:4"), dns)
    assert route.current.target == "a.example:1"
    assert route.advance("c.example:4") == Endpoint("c.example:4", True)  # skips b and the pair
    # A leader named by its name reaches the first of that name's addresses.
    assert route.advance("pair.example:3") == Endpoint("10.0.0.1:3", False, "pair.example:3")
    # A leader that is not in the list is tried once, with TLS as the standby that named it.
    route = Route(parse_servers("grpcs://a.example:1,grpcs://b.example:2"), dns)
    assert route.advance("10.9.9.9:1") == Endpoint("10.9.9.9:1", True)
    assert route.advance() == Endpoint("b.example:2", True)  # then the list goes on
    # A standby naming itself (stale lease): just the next one.
    assert route.advance("b.example:2") == Endpoint("a.example:1", True)


def test_the_system_resolver_reads_getaddrinfo() -> None:
    assert system_resolver("127.0.0.1", 80) == ["127.0.0.1"]
    with pytest.raises(OSError):
        system_resolver("no-such-name.invalid", 80)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, str]]:
    with ServerProcess(tmp_path_factory.mktemp("addr") / "perseus.db") as srv:
        with httpx.Client(base_url=srv.http_url, timeout=30.0) as http:
            job = http.post(
                "/jobs", json={"stages": 2, "microbatches": 2, "blocking_power": 70.0}
            ).json()["id"]
        yield srv, job


def test_a_rank_reaches_the_server_at_the_second_address_of_its_name(
    served: tuple[ServerProcess, str],
) -> None:
    srv, job = served
    port = int(srv.grpc_target.rsplit(":", 1)[1])
    # The name's first address has nobody listening (the server binds 127.0.0.1 only).
    dns = _Resolver({"pair.perseus.test": ["127.0.0.3", "127.0.0.1"]})
    ident = RankRegistration(job, 0, 0, 0, 0, "NVIDIA A40", (), "test")
    link = ServerLink(
        f"pair.perseus.test:{port}", ident, lambda plan: None, resolver=dns, backoff_initial=0.05
    )
    link.start()
    try:
        assert link.wait_registered(30), link.last_error
        assert link.target == f"127.0.0.1:{port}"
        assert link.switches >= 1 and link.rank_id is not None
    finally:
        link.close()


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_tls_to_a_resolved_address_checks_the_name(tmp_path: Path) -> None:
    """TLS to a resolved address still verifies the DNS name.

    The certificate names the DNS name (and ``localhost``, for the harness), not 127.0.0.1: the
    rank dials the address the name resolved to and still verifies the name.
    """
    d = tmp_path
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=test CA",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        "-keyout", str(d / "ca.key"), "-out", str(d / "ca.pem"),
    )  # fmt: skip
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=pair.perseus.test",
        "-keyout", str(d / "server.key"), "-out", str(d / "server.csr"),
    )  # fmt: skip
    (d / "ext.cnf").write_text("subjectAltName=DNS:pair.perseus.test,DNS:localhost\n")
    _openssl(
        "x509", "-req", "-in", str(d / "server.csr"), "-CA", str(d / "ca.pem"),
        "-CAkey", str(d / "ca.key"), "-CAcreateserial", "-days", "1",
        "-extfile", str(d / "ext.cnf"), "-out", str(d / "server.pem"),
    )  # fmt: skip
    (d / "chain.pem").write_bytes((d / "server.pem").read_bytes() + (d / "ca.pem").read_bytes())
    with ServerProcess(
        d / "p.db", host="localhost", tls_cert=d / "chain.pem", tls_key=d / "server.key"
    ) as srv:
        ca = ssl.create_default_context(cafile=str(d / "ca.pem"))
        job = httpx.post(
            srv.http_url + "/jobs",
            json={"stages": 2, "microbatches": 2, "blocking_power": 70.0},
            verify=ca,
            timeout=30,
        ).json()["id"]
        port = int(srv.grpc_target.rsplit(":", 1)[1])
        dns = _Resolver({"pair.perseus.test": ["127.0.0.3", "127.0.0.1"]})
        ident = RankRegistration(job, 0, 0, 0, 0, "NVIDIA A40", (), "test")
        link = ServerLink(
            f"grpcs://pair.perseus.test:{port},grpc://127.0.0.1:1",
            ident,
            lambda plan: None,
            root_certificates=(d / "ca.pem").read_bytes(),
            resolver=dns,
            backoff_initial=0.05,
        )
        link.start()
        try:
            assert link.wait_registered(30), link.last_error
            assert link.target == f"127.0.0.1:{port}"
        finally:
            link.close()
