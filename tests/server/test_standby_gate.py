"""The standby's REST answers in every state, through the gate itself (ASGI, no server).

No leader known yet, a leader known, HEAD, a leader that advertised no REST address, and the switch
to serving (the app behind it answers, ``/healthz`` with the role and epoch). With a token
configured, a caller without a valid credential hears nothing of the leader (401); a leader whose
lease no longer holds answers 503 naming no leader, and serves again once it holds.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from perseus_server.service.credentials import Credentials
from perseus_server.standby import LeaderAddress, Standby, StandbyGate


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """What the service would answer: 200 and the path."""
    body = scope["path"].encode()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": body})


def _call(
    standby: Standby,
    method: str,
    url: str,
    credentials: Credentials | None = None,
    token: str | None = None,
) -> httpx.Response:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}

    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=StandbyGate(_app, standby, credentials))
        async with httpx.AsyncClient(transport=transport, base_url="http://standby") as c:
            return await c.request(method, url, headers=headers)

    return asyncio.run(go())


def test_before_any_leader_is_known_everything_is_503() -> None:
    s = Standby()
    for method, url in (("GET", "/jobs"), ("POST", "/jobs"), ("GET", "/healthz")):
        r = _call(s, method, url)
        assert r.status_code == 503, (method, url)
        assert r.headers["perseus-role"] == "standby"
        assert "perseus-leader" not in r.headers
    assert _call(s, "GET", "/healthz").json() == {
        "status": "standby",
        "role": "standby",
        "leader": None,
        "epoch": None,
    }


def test_with_a_leader_reads_are_redirected_and_writes_refused() -> None:
    s = Standby()
    s.heard(LeaderAddress("a:1:x", 4, "a.example:50051", "https://a.example:8000", live=False))
    r = _call(s, "GET", "/jobs/j1/plan?slowdown=0.1")
    assert r.status_code == 307
    assert r.headers["location"] == "https://a.example:8000/jobs/j1/plan?slowdown=0.1"
    head = _call(s, "HEAD", "/jobs")
    assert head.status_code == 307 and head.content == b""
    w = _call(s, "DELETE", "/jobs/j1")
    assert w.status_code == 503 and w.headers["retry-after"] == "2"
    assert w.headers["perseus-leader"] == "https://a.example:8000"
    assert "a.example:50051" in w.json()["detail"] and "lease expired" in w.json()["detail"]
    h = _call(s, "GET", "/healthz").json()
    assert (h["epoch"], h["leader"]["grpc"], h["leader"]["lease_live"]) == (
        4,
        "a.example:50051",
        False,
    )


def test_a_standby_answers_its_own_metrics() -> None:
    s = Standby()
    assert "perseus_leader_epoch" not in _call(s, "GET", "/metrics").text
    s.heard(LeaderAddress("a:1:x", 4, "a.example:50051", "https://a.example:8000"))
    r = _call(s, "GET", "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    samples = dict(line.split(" ") for line in r.text.splitlines() if not line.startswith("#"))
    assert samples == {"perseus_leader": "0", "perseus_leader_epoch": "4"}


def test_a_leader_without_a_rest_address_gets_no_redirect() -> None:
    s = Standby()
    s.heard(LeaderAddress("a:1:x", 2))  # an older leader that stored no addresses
    r = _call(s, "GET", "/jobs")
    assert r.status_code == 503 and "an address it did not advertise" in r.json()["detail"]


def test_once_it_leads_the_app_answers() -> None:
    s = Standby()
    s.heard(LeaderAddress("a:1:x", 4, "a.example:50051", "https://a.example:8000"))
    s.lead(5)
    r = _call(s, "POST", "/jobs")
    assert (r.status_code, r.text) == (200, "/jobs")
    assert "perseus-role" not in r.headers
    h = _call(s, "GET", "/healthz")
    assert h.status_code == 200
    assert (h.headers["perseus-role"], h.headers["perseus-epoch"]) == ("leader", "5")


def test_without_a_valid_credential_nothing_of_the_leader() -> None:
    s = Standby()
    s.heard(LeaderAddress("a:1:x", 4, "a.example:50051", "https://a.example:8000"))
    creds = Credentials(None, admin="the-token")
    for token in (None, "wrong"):
        for method, url in (("GET", "/jobs"), ("POST", "/jobs"), ("GET", "/metrics")):
            r = _call(s, method, url, creds, token)
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
            assert "a.example" not in r.text + str(r.headers) and "a:1:x" not in r.text
        h = _call(s, "GET", "/healthz", creds, token)
        assert h.status_code == 503
        assert h.json() == {"status": "standby", "role": "standby", "leader": None, "epoch": None}
        assert "perseus-leader" not in h.headers
    r = _call(s, "POST", "/jobs", creds, "the-token")
    assert r.status_code == 503 and r.json()["leader"]["grpc"] == "a.example:50051"
    assert _call(s, "GET", "/jobs", creds, "the-token").status_code == 307


def test_a_leader_whose_lease_lapsed_answers_503_until_it_holds_again() -> None:
    s = Standby()
    s.heard(LeaderAddress("old:1:x", 4, "old.example:50051", "https://old.example:8000"))
    holds = [True]
    s.lead(5, holds=lambda: holds[0])
    assert _call(s, "GET", "/jobs").status_code == 200
    holds[0] = False
    assert (s.serving, s.role) == (False, "lapsed")
    for method in ("GET", "POST", "DELETE"):
        r = _call(s, method, "/jobs")
        assert r.status_code == 503 and r.headers["retry-after"] == "2", r.text
        assert "lease (epoch 5) ran out" in r.json()["detail"] and r.json()["leader"] is None
        assert r.headers["perseus-role"] == "lapsed" and "perseus-leader" not in r.headers
    h = _call(s, "GET", "/healthz")
    assert h.status_code == 503 and h.json()["role"] == "lapsed"
    holds[0] = True  # renewed: it serves again
    assert _call(s, "POST", "/jobs").status_code == 200
