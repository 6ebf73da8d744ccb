"""An open server (no token) against DNS rebinding and cross-site requests.

Only loopback and allowed host names are answered, a state-changing request from a foreign origin is
refused (403, a problem body naming the header), and no CORS header opens an answer to another site.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from perseus_server import ServerProcess
from perseus_server.rest.origins import Origins, host_name

from ..conftest import make_job, problem_field

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    db = tmp_path_factory.mktemp("db") / "perseus.db"
    with ServerProcess(db, extra_args=["--allowed-host", "perseus.lab.example"]) as s:
        yield s


@pytest.fixture(scope="module")
def client(srv: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=srv.http_url, timeout=30) as c:
        yield c


def test_a_rebound_host_name_is_refused(srv: ServerProcess, client: httpx.Client) -> None:
    job = make_job(client)
    port = srv.http_url.rsplit(":", 1)[-1]
    for method, path in (("DELETE", f"/jobs/{job}"), ("GET", "/jobs"), ("GET", "/metrics")):
        r = client.request(method, path, headers={"Host": f"attacker.example:{port}"})
        assert r.status_code == 403, r.text
        assert problem_field(r) == "Host"
    assert client.get(f"/jobs/{job}").status_code == 200  # not deleted
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", "[::1]", "perseus.lab.example"):
        assert client.get("/jobs", headers={"Host": host}).status_code == 200, host
    # /healthz too: a rebinding page learns nothing
    assert client.get("/healthz", headers={"Host": "attacker.example"}).status_code == 403


def test_a_foreign_origin_may_not_change_state(srv: ServerProcess, client: httpx.Client) -> None:
    job = make_job(client)
    simple = {"Content-Type": "text/plain"}  # what a page sends without a CORS preflight
    for origin in ("http://attacker.example", "null", "https://127.0.0.1.attacker.example"):
        r = client.post(f"/jobs/{job}/frontier", headers={**simple, "Origin": origin})
        assert r.status_code == 403, (origin, r.text)
        assert problem_field(r) == "Origin"
        r = client.delete(f"/jobs/{job}", headers={"Origin": origin})
        assert r.status_code == 403
    r = client.delete(f"/jobs/{job}", headers={"Sec-Fetch-Site": "cross-site"})
    assert r.status_code == 403 and problem_field(r) == "Origin"
    # the operator's own page (same origin) and reads from anywhere are not refused
    assert client.get(f"/jobs/{job}", headers={"Origin": "http://attacker.example"}).is_success
    r = client.delete(f"/jobs/{job}", headers={"Origin": srv.http_url})
    assert r.status_code == 204


def test_cors_stays_closed(client: httpx.Client) -> None:
    pre = client.options(
        "/jobs",
        headers={"Origin": "http://attacker.example", "Access-Control-Request-Method": "POST"},
    )
    assert "access-control-allow-origin" not in pre.headers
    r = client.get("/jobs", headers={"Origin": "http://attacker.example"})
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


def test_host_names() -> None:
    assert host_name("[::1]:8000") == "::1" and host_name("LocalHost.:80") == "localhost"
    o = Origins(["Perseus.Lab.Example:443"])
    assert o.allows("perseus.lab.example") and o.allows("127.5.0.1") and o.allows("a.localhost")
    assert not o.allows("attacker.example") and not o.allows("10.0.0.1")
