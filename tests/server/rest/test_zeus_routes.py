"""Zeus's routes of ``perseus serve --zeus``: bad input, credentials in the URL, fallback, lifecycle.

A real server (tokens required) and the protocol as Zeus's client speaks it (its bodies, httpx's
default 5 s timeout on registration); the client itself runs in
``tests/client/integrations/test_zeus_e2e.py``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from perseus.schedules import one_f_one_b
from perseus_server.config import Limits, ZeusConfig
from perseus_server.rest import create_app
from perseus_server.runtime.sql_store import SqlStore
from perseus_server.service import PerseusService
from perseus_server.testing.process import ServerProcess

from ..conftest import BLOCKING_A40, sliced_profile_csv, wait_frontier

ADMIN = "zeus-routes-admin-token"
UNKNOWN = "0123456789abcdef"
#: Zeus's client waits 5 s (httpx's default) for registration.
ZEUS_TIMEOUT = 5.0


def _ok(r: httpx.Response, status: int = 200) -> Any:
    assert r.status_code == status, f"{r.request.method} {r.request.url.path}: {r.text}"
    return r.json() if r.content else None


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    d = tmp_path_factory.mktemp("zeus-routes")
    args = ["--zeus", "--zeus-plan-wait", "1", "--idle-after", "2"]
    with ServerProcess(d / "perseus.db", token=ADMIN, extra_args=args) as s:
        yield s


@pytest.fixture(scope="module")
def admin(srv: ServerProcess) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {ADMIN}"}
    with httpx.Client(base_url=srv.http_url, headers=headers, timeout=60) as c:
        yield c


def _prototype(admin: httpx.Client, tenant: str, name: str, **body: Any) -> str:
    spec = {"stages": 2, "microbatches": 4, "blocking_power": BLOCKING_A40, "gpu_model": "A40"}
    r = admin.post("/jobs", json={**spec, **body, "name": name, "tenant": tenant})
    return str(_ok(r, 201)["id"])


def _profile(admin: httpx.Client, job: str, csv: str) -> None:
    r = admin.put(f"/jobs/{job}/profile", content=csv, headers={"content-type": "text/csv"})
    _ok(r)


@pytest.fixture(scope="module")
def world(admin: httpx.Client) -> dict[str, Any]:
    """Two tenants, each with a zeus credential and a solved 2-stage prototype ``proto``."""
    out: dict[str, Any] = {"csv": sliced_profile_csv()}
    for tenant in ("team-a", "team-b"):
        _ok(admin.post("/tenants", json={"id": tenant}), 201)
        cred = _ok(admin.post("/credentials", json={"scope": "zeus", "tenant": tenant}), 201)
        out[tenant] = cred["credential"]
        job = _prototype(admin, tenant, "proto")
        _profile(admin, job, out["csv"])
        _ok(admin.post(f"/jobs/{job}/frontier"), 202)
        out[f"{tenant}/proto"] = job
    for tenant in ("team-a", "team-b"):
        assert wait_frontier(admin, out[f"{tenant}/proto"])["status"] == "done"
    tenant_cred = admin.post("/credentials", json={"scope": "tenant", "tenant": "team-a"})
    out["tenant-credential"] = _ok(tenant_cred, 201)["credential"]
    out["clocks"] = sorted(
        {int(line.split(",")[2]) for line in out["csv"].splitlines()[1:]}, reverse=True
    )
    return out


def _zeus(srv: ServerProcess, credential: str) -> httpx.Client:
    """A client as Zeus's: no header, the credential in the URL, a 5 s timeout."""
    return httpx.Client(base_url=f"{srv.http_url}/zeus/{credential}", timeout=ZEUS_TIMEOUT)


def _job_info(pp: int = 2, dp: int = 1, metadata: str | None = "proto", **extra: Any) -> Any:
    body = {"job_id": "", "pp_degree": pp, "dp_degree": dp, "tp_degree": 1}
    return {**body, "world_size": pp * dp, "job_metadata": metadata, **extra}


def _rank(rank: int, pp: int, clocks: list[int], dp_rank: int = 0) -> dict[str, Any]:
    return {
        "rank": rank,
        "dp_rank": dp_rank,
        "pp_rank": rank % pp,
        "tp_rank": 0,
        "available_frequencies": clocks,
    }


def test_bad_registrations_say_what_to_do(
    srv: ServerProcess, admin: httpx.Client, world: Any
) -> None:
    gpipe = _prototype(admin, "team-a", "gpipe2", schedule="gpipe")
    bare = _prototype(admin, "team-a", "bare")
    unsolved = _prototype(admin, "team-a", "unsolved")
    _profile(admin, unsolved, world["csv"])
    cases = [
        (_job_info(metadata=None), 422, "job_metadata", "--zeus-default-prototype"),
        (_job_info(metadata="   "), 422, "job_metadata", "pass the name or id"),
        (_job_info(metadata="nope"), 422, "job_metadata", "no job named 'nope'"),
        (_job_info(metadata=world["team-b/proto"]), 422, "job_metadata", "no job named"),
        (_job_info(pp=3), 422, "pp_degree", "has 2 pipeline stages"),
        (_job_info(world_size=3), 422, "world_size", "pp_degree * dp_degree * tp_degree"),
        (_job_info(job_id="x"), 422, "job_id", "must be empty"),
        (_job_info(pp=0), 422, "pp_degree", ""),
        (_job_info(metadata="gpipe2"), 422, "job_metadata", "schedule 1f1b"),
        (_job_info(metadata="bare"), 409, "job_metadata", f"PUT /jobs/{bare}/profile"),
        (_job_info(metadata="unsolved"), 409, "job_metadata", f"POST /jobs/{unsolved}/frontier"),
    ]
    with _zeus(srv, world["team-a"]) as z:
        for body, status, field, says in cases:
            r = z.post("/register_job", json=body)
            assert (r.status_code, r.json().get("field")) == (status, field), (body, r.text)
            assert says in r.json()["detail"], r.text
            assert world["team-a"] not in r.text
        # another tenant's prototype, named by its id, is refused as an unknown name is
        foreign = z.post("/register_job", json=_job_info(metadata=world["team-b/proto"])).json()
        unknown = z.post("/register_job", json=_job_info(metadata=UNKNOWN)).json()
        assert foreign["detail"].replace(world["team-b/proto"], UNKNOWN) == unknown["detail"]
    for job in (gpipe, bare, unsolved):
        _ok(admin.delete(f"/jobs/{job}"), 204)


def _run(z: httpx.Client, pp: int, clocks: list[int], dp: int = 1, **info: Any) -> str:
    run = _ok(z.post("/register_job", json=_job_info(pp=pp, dp=dp, **info)))
    assert isinstance(run, str)
    for rank in range(pp * dp):
        _ok(z.post(f"/register_rank/{run}", json=_rank(rank, pp, clocks, rank // pp)))
    return run


def test_a_run_is_an_ordinary_job_of_its_tenant(
    srv: ServerProcess, admin: httpx.Client, world: Any
) -> None:
    with _zeus(srv, world["team-a"]) as z:
        run = _run(z, 2, world["clocks"], dp=2)
        schedules = [_ok(z.get(f"/schedule/{run}", params={"rank": r})) for r in range(4)]
    job = _ok(admin.get(f"/jobs/{run}"))
    assert (job["tenant"], job["data_parallel"], job["name"]) == ("team-a", 2, "proto (Zeus run)")
    status = _ok(admin.get(f"/jobs/{run}/status"))
    assert status["plan"]["kind"] == "plan" and len(status["ranks"]) == 4
    for rank, doc in enumerate(schedules):
        assert doc["rank"] == rank
        order = one_f_one_b(2, 4).orders[rank % 2]
        assert [name for name, _ in doc["frequencies"]] == [op.kind for op in order]
        assert all(mhz in world["clocks"] for _, mhz in doc["frequencies"])
    # ordinary everywhere else: its tenant's listing and metrics show it, the other's do not
    tenant = {"Authorization": f"Bearer {world['tenant-credential']}"}
    listed = _ok(admin.get("/jobs", headers=tenant))["jobs"]
    assert run in {j["id"] for j in listed}
    assert f'job="{run}"' in admin.get("/metrics").text
    with _zeus(srv, world["team-a"]) as z:  # a result is taken (the released client sends none)
        result = {"rank": 0, "iter_time": [0.5], "iter_energy": [100.0]}
        assert z.post(f"/result/{run}", json=result).status_code == 200


def test_ranks_are_checked_against_the_run(srv: ServerProcess, world: Any) -> None:
    clocks = world["clocks"]
    with _zeus(srv, world["team-a"]) as z:
        run = _ok(z.post("/register_job", json=_job_info()))
        cases = [
            (_rank(2, 2, clocks), 422, "rank"),
            ({**_rank(0, 2, clocks), "pp_rank": 2}, 422, "pp_rank"),
            ({**_rank(0, 2, clocks), "dp_rank": 1}, 422, "dp_rank"),
            (_rank(0, 2, clocks[1:]), 422, "available_frequencies"),  # lacks a profile clock
            (_rank(0, 2, []), 422, "available_frequencies"),
            ({**_rank(0, 2, clocks), "available_frequencies": [0]}, 422, "available_frequencies.0"),
        ]
        for body, status, field in cases:
            r = z.post(f"/register_rank/{run}", json=body)
            assert (r.status_code, r.json().get("field")) == (status, field), (body, r.text)
        r = z.get(f"/schedule/{run}", params={"rank": 0})
        assert (r.status_code, r.json()["field"]) == (409, "rank"), r.text
        assert "register_rank" in r.json()["detail"]


def test_credentials_in_the_url(srv: ServerProcess, admin: httpx.Client, world: Any) -> None:
    secrets = [world["team-a"], world["team-b"], world["tenant-credential"], ADMIN]
    with _zeus(srv, world["team-b"]) as zb:
        b_run = _run(zb, 2, world["clocks"])
    bodies = []
    with _zeus(srv, world["team-a"]) as z:
        # another tenant's run answers exactly as an unknown id, on every route with an id
        for method, path, body in (
            ("POST", "/register_rank/{}", _rank(0, 2, world["clocks"])),
            ("GET", "/schedule/{}?rank=0", None),
            ("POST", "/result/{}", {"rank": 0, "iter_time": [], "iter_energy": []}),
        ):
            foreign = z.request(method, path.format(b_run), json=body)
            unknown = z.request(method, path.format(UNKNOWN), json=body)
            assert foreign.status_code == unknown.status_code == 404
            assert foreign.json()["detail"].replace(b_run, UNKNOWN) == unknown.json()["detail"]
            bodies += [foreign.text, unknown.text]
        # a job of the caller's own tenant that is not a run: 409, saying so
        r = z.get(f"/schedule/{world['team-a/proto']}", params={"rank": 0})
        assert (r.status_code, r.json()["field"]) == (409, "job_id") and "not a Zeus run" in r.text
    # the zeus credential opens nothing else, even as a header
    zeus_header = {"Authorization": f"Bearer {world['team-a']}"}
    for path in ("/jobs", f"/jobs/{world['team-a/proto']}", "/metrics", "/credentials"):
        r = admin.get(path, headers=zeus_header)
        assert r.status_code == 403, (path, r.text)
        bodies.append(r.text)
    # only a zeus credential is taken from a URL; none, or a wrong one, is a 401
    for credential, status in ((world["tenant-credential"], 403), (ADMIN, 403), ("nope", 401)):
        with _zeus(srv, credential) as z:
            r = z.post("/register_job", json=_job_info())
            assert (r.status_code, r.json()["field"]) == (status, "credential"), r.text
            bodies.append(r.text)
    r = httpx.post(f"{srv.http_url}/zeus/register_job", json=_job_info(), timeout=ZEUS_TIMEOUT)
    assert r.status_code == 401 and "/zeus/<credential>" in r.json()["detail"]
    # never in an answer, the metrics, the listing of credentials, or the server's log
    bodies += [admin.get("/metrics").text, admin.get("/credentials").text, srv.output()]
    assert "zeus" in {c["scope"] for c in admin.get("/credentials").json()["credentials"]}
    for text in bodies:
        assert not any(s in text for s in secrets[:3]), text[:300]
    assert 'route="/zeus/schedule/{job_id}"' in bodies[-3]  # metrics label the template


def test_no_plan_in_time_is_the_max_clock_plan(
    srv: ServerProcess, admin: httpx.Client, world: Any
) -> None:
    """A prototype whose frontier never comes: the ranks get max clocks; the status says why.

    Registration answers within Zeus's 5 s while the prototype's large solve runs.
    """
    big = _prototype(admin, "team-a", "big", stages=8, microbatches=128)
    csv = sliced_profile_csv(stages=8, every=1)
    _profile(admin, big, csv)
    _ok(admin.post(f"/jobs/{big}/frontier"), 202)
    clocks = sorted({int(line.split(",")[2]) for line in csv.splitlines()[1:]}, reverse=True)
    with _zeus(srv, world["team-a"]) as z:
        run = _run(z, 8, [*clocks, clocks[0] + 15], metadata="big")
        _ok(admin.delete(f"/jobs/{big}/frontier"), 202)  # cancelled: its frontier never comes
        schedules = [_ok(z.get(f"/schedule/{run}", params={"rank": r})) for r in range(8)]
    for rank, doc in enumerate(schedules):
        want = [[op.kind, clocks[0] + 15] for op in one_f_one_b(8, 128).orders[rank]]
        assert doc["frequencies"] == want
    plan = _ok(admin.get(f"/jobs/{run}/status"))["plan"]
    assert plan["kind"] == "max_clock" and "no plan within 1 s" in plan["reason"], plan
    assert "its prototype" in plan["reason"] and "frontier" in plan["reason"]
    _ok(admin.delete(f"/jobs/{big}"), 204)


def test_a_run_goes_idle_without_contact(
    srv: ServerProcess, admin: httpx.Client, world: Any
) -> None:
    with _zeus(srv, world["team-a"]) as z:
        run = _run(z, 2, world["clocks"])
        _ok(z.get(f"/schedule/{run}", params={"rank": 0}))
    assert _ok(admin.get(f"/jobs/{run}"))["lifecycle"]["state"] == "active"
    for _ in range(600):
        life = _ok(admin.get(f"/jobs/{run}"))["lifecycle"]
        if life["state"] == "idle":
            break
        time.sleep(0.1)
    assert life["state"] == "idle", life
    with _zeus(srv, world["team-a"]) as z:  # a late call is contact: active again
        _ok(z.get(f"/schedule/{run}", params={"rank": 1}))
    assert _ok(admin.get(f"/jobs/{run}"))["lifecycle"]["state"] == "active"


def test_without_the_flag_there_are_no_zeus_routes(tmp_path: Path) -> None:
    store = SqlStore.open(tmp_path / "plain.db")
    try:
        for zeus, status in ((None, 404), (ZeusConfig(), 422)):
            app = create_app(PerseusService(store, Limits()), zeus_routes=zeus)
            with TestClient(app, base_url="http://localhost") as client:
                r = client.post("/zeus/register_job", json=_job_info(metadata="nope"))
                assert r.status_code == status, r.text
            documented = {p for p in app.openapi()["paths"] if p.startswith("/zeus/")}
            assert len(documented) == (0 if zeus is None else 4)
    finally:
        store.close()


def test_a_run_under_a_power_budget_gets_its_share(
    srv: ServerProcess, admin: httpx.Client, world: Any
) -> None:
    """The schedule is the plan the budget deploys for the run once its ranks draw on it."""
    with _zeus(srv, world["team-a"]) as z:
        run = _ok(z.post("/register_job", json=_job_info()))
        fastest = _ok(admin.get(f"/jobs/{run}/status"))["plan"]
        assert fastest["constraint"] == "own policy" and fastest["pipelines"][0]["index"] == 0
        watts = 0.9 * fastest["average_power"]
        _ok(admin.put("/power-budget", json={"watts": watts, "jobs": [run]}))
        try:
            for rank in range(2):
                _ok(z.post(f"/register_rank/{run}", json=_rank(rank, 2, world["clocks"])))
            schedules = [_ok(z.get(f"/schedule/{run}", params={"rank": r})) for r in range(2)]
            plan = _ok(admin.get(f"/jobs/{run}/status"))["plan"]
        finally:
            _ok(admin.delete("/power-budget"), 204)
    assert plan["constraint"] == "power budget", plan
    index = plan["pipelines"][0]["index"]
    assert index > 0 and plan["average_power"] <= watts, plan
    steps = _ok(admin.get(f"/jobs/{run}/plan", params={"index": index, "steps": True}))["steps"]
    for rank, doc in enumerate(schedules):
        assert doc["frequencies"] == [[s["instruction"], s["frequency"]] for s in steps[rank]]
