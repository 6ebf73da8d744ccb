"""``PERSEUS_TLS_CA`` / ``tls_ca=`` / ``--tls-ca``.

Clients trust a private CA without code, for gRPC and REST, against a real ``perseus serve`` with
TLS whose certificate a CA made here signed (``openssl``).
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
import sys
import textwrap
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from perseus_client.errors import ConfigError
from perseus_client.transport import read_tls_ca, tls_context
from perseus_server import ServerProcess

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command"),
]

TOKEN = "tls-ca-token"


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A self-signed CA, and a server certificate for localhost/127.0.0.1 that it signed."""
    d = tmp_path_factory.mktemp("pki")
    openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        "-subj", "/CN=Perseus test CA",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        "-keyout", str(d / "ca.key"), "-out", str(d / "ca.pem"),
    )  # fmt: skip
    openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost",
        "-keyout", str(d / "server.key"), "-out", str(d / "server.csr"),
    )  # fmt: skip
    (d / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    openssl(
        "x509", "-req", "-in", str(d / "server.csr"), "-CA", str(d / "ca.pem"),
        "-CAkey", str(d / "ca.key"), "-CAcreateserial", "-days", "1",
        "-extfile", str(d / "ext.cnf"), "-out", str(d / "server.pem"),
    )  # fmt: skip
    # The chain the server presents (its certificate, then the CA's).
    (d / "fullchain.pem").write_bytes((d / "server.pem").read_bytes() + (d / "ca.pem").read_bytes())
    return d


@pytest.fixture(scope="module")
def server(pki: Path) -> Iterator[ServerProcess]:
    with ServerProcess(
        pki / "perseus.db", token=TOKEN, tls_cert=pki / "fullchain.pem", tls_key=pki / "server.key"
    ) as srv:
        yield srv


RANK = textwrap.dedent(
    """
    import json, os, sys
    from perseus_client import Connection, PerseusClient, SimulatedGpu

    gpu = SimulatedGpu({(0, "forward"): {1410: (0.01, 3.0)}}, time_scale=0.0)
    client = PerseusClient(gpu=gpu, handle_signals=False, connection=Connection(backoff_max=0.2))
    ok = client.link.wait_registered(float(sys.argv[1]))
    print(json.dumps({"registered": ok, "error": client.link.last_error}), flush=True)
    client.close()
    """
)


def run_rank(server: ServerProcess, env: dict[str, str], wait: float = 30.0) -> dict[str, object]:
    import json
    import os

    full = {k: v for k, v in os.environ.items() if k != "PERSEUS_TLS_CA"}
    job = httpx.post(
        f"{server.http_url}/jobs",
        headers=server.headers,
        json={"stages": 1, "microbatches": 1, "blocking_power": 50.0},
        verify=ssl.create_default_context(cafile=str(Path(str(server.tls_cert)).parent / "ca.pem")),
        timeout=30,
    ).json()["id"]
    full.update(
        {
            "PERSEUS_SERVER": server.grpc_target,  # host:port, no scheme: the CA implies TLS
            "PERSEUS_TOKEN": TOKEN,
            "PERSEUS_JOB": job,
            **env,
        }
    )
    proc = subprocess.run(
        [sys.executable, "-c", RANK, str(wait)],
        env=full,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def test_a_rank_registers_over_tls_with_the_ca_from_the_environment(
    server: ServerProcess, pki: Path
) -> None:
    assert run_rank(server, {"PERSEUS_TLS_CA": str(pki / "ca.pem")}) == {
        "registered": True,
        "error": None,
    }


def test_without_the_ca_the_server_is_not_trusted(server: ServerProcess, pki: Path) -> None:
    out = run_rank(server, {"PERSEUS_SERVER": "grpcs://" + server.grpc_target}, wait=3.0)
    assert out["registered"] is False and "UNAVAILABLE" in str(out["error"])


def test_rest_with_the_ca_from_the_environment(
    server: ServerProcess, pki: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PERSEUS_TLS_CA", str(pki / "ca.pem"))
    ctx = tls_context()
    assert ctx is not None
    with urllib.request.urlopen(f"{server.http_url}/healthz", context=ctx, timeout=30) as r:
        assert r.status == 200
    with httpx.Client(base_url=server.http_url, headers=server.headers, verify=ctx) as c:
        assert c.get("/jobs").status_code == 200
    with pytest.raises(httpx.ConnectError):  # the system's roots do not know this CA
        httpx.get(f"{server.http_url}/healthz", timeout=30)


def test_a_bad_ca_file_is_a_configuration_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PERSEUS_TLS_CA", str(tmp_path / "missing.pem"))
    with pytest.raises(ConfigError) as e:
        read_tls_ca()
    assert e.value.field == "PERSEUS_TLS_CA" and "cannot read" in str(e.value)
    (tmp_path / "key.pem").write_text("-----BEGIN PRIVATE KEY-----\n")
    with pytest.raises(ConfigError) as e:
        read_tls_ca(str(tmp_path / "key.pem"))
    assert e.value.field == "tls_ca" and "no PEM certificate" in str(e.value)
    from perseus_client import Connection, PerseusClient

    with pytest.raises(ConfigError):  # the client raises it too, before starting anything
        PerseusClient(
            "localhost:1", "job", connection=Connection(tls_ca=str(tmp_path / "missing.pem"))
        )


def test_an_explicit_plain_address_stays_plain(server: ServerProcess, pki: Path) -> None:
    out = run_rank(
        server,
        {"PERSEUS_TLS_CA": str(pki / "ca.pem"), "PERSEUS_SERVER": "grpc://" + server.grpc_target},
        wait=3.0,
    )
    assert out["registered"] is False  # plain gRPC to a TLS port
