"""What the shipped alert rules read, on a real ``perseus serve``'s ``/metrics``.

``deploy/prometheus/alerts.yml`` routes a team's alerts on the series the server exports; its unit
test (``alerts.test.yml``) feeds them as it believes the server writes them. Here one server with
two tenants is driven into the states the rules alert on (a solve that failed, a tenant whose
jobs cannot get under its part of the power budget) and its ``/metrics`` page is checked:

- every server series the rules and their unit tests use is on the page, and where the page has
  samples of it, with exactly the label names the unit tests give it (besides the scrape's own
  ``job`` and ``instance``): a renamed metric or label fails here, not silently in production;
- no series carries a ``job`` label: that is Prometheus's (the scrape's), the Perseus job is
  ``perseus_job``, so no ``honor_labels`` is needed and nothing is overwritten;
- ``perseus_leader`` is 1 on the server that serves; ``perseus_job_frontier_failed`` is 1 for the
  job whose solve failed and 0 for the others; ``perseus_tenant_power_budget_feasible`` is 0 for
  the tenant over its part and 1 for the one within it.

Then a real Prometheus (Debian's ``prometheus``; skipped, saying so, where it is absent) scrapes a
real server with a read credential, as ``docs/operations.md`` configures it (no ``honor_labels``),
and evaluates the shipped rules: a tenant's failed solve fires ``PerseusSolvesFailing`` naming the
tenant, the job and its name, with Prometheus's own ``job`` left as the scrape's.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from perseus.profiles import load_profile
from perseus_common.proto import perseus_pb2 as pb
from perseus_common.proto import perseus_pb2_grpc as pb_grpc
from perseus_server import ServerProcess

from .conftest import A40, ROOT, make_job, wait_frontier

ADMIN = "the-admin-token"
PROMETHEUS = ROOT / "deploy" / "prometheus"
#: Labels the scrape adds (Prometheus's target labels), never the server.
SCRAPE_LABELS = {"job", "instance"}


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def admin(tmp_path: Path) -> Iterator[tuple[httpx.Client, ServerProcess]]:
    with (
        ServerProcess(tmp_path / "perseus.db", token=ADMIN) as srv,
        httpx.Client(base_url=srv.http_url, headers=_bearer(ADMIN), timeout=60) as http,
    ):
        yield http, srv


def _tenant(admin: httpx.Client, tenant: str, **terms: Any) -> httpx.Client:
    """A client with ``tenant``'s own credential (the tenant made first)."""
    assert admin.post("/tenants", json={"id": tenant, **terms}).status_code == 201
    r = admin.post("/credentials", json={"scope": "tenant", "tenant": tenant})
    assert r.status_code == 201, r.text
    return httpx.Client(
        base_url=str(admin.base_url), headers=_bearer(r.json()["credential"]), timeout=60
    )


def _solved(http: httpx.Client, csv_text: str, name: str) -> tuple[str, str]:
    """A job of ``http``'s tenant, solved: (id, rank credential)."""
    r = http.post(
        "/jobs",
        json={"name": name, "stages": 2, "microbatches": 4, "blocking_power": 70.38,
              "gpu_model": "A40"},
    )  # fmt: skip
    assert r.status_code == 201, r.text
    job, credential = r.json()["id"], r.json()["rank_credential"]
    r = http.put(f"/jobs/{job}/profile", content=csv_text, headers={"content-type": "text/csv"})
    assert r.status_code == 200, r.text
    assert http.post(f"/jobs/{job}/frontier").status_code == 202
    assert wait_frontier(http, job, timeout=300)["status"] == "done"
    return job, credential


def _run(stub: pb_grpc.PlanServiceStub, job: str, credential: str) -> list[Any]:
    """Every rank of a 2-stage job registered with a plan stream open (its first plan read)."""
    md = (("authorization", f"Bearer {credential}"),)
    streams = []
    for g in range(2):
        req = pb.RegisterRankRequest(
            job_id=job, global_rank=g, pipeline_rank=g, gpu_name="NVIDIA A40", hostname="n"
        )
        rank = stub.RegisterRank(req, metadata=md, timeout=30).rank_id
        stream = stub.WatchPlan(pb.WatchPlanRequest(job_id=job, rank_id=rank), metadata=md)
        next(stream)
        streams.append(stream)
    return streams


def _failed_solve(admin: httpx.Client) -> str:
    """A job whose frontier computation failed: its worker killed while it runs."""
    p = load_profile(A40)
    csv_text = "stage,instruction,frequency,time,energy\n" + "".join(
        f"{r['stage']},{r['instruction']},{r['frequency']},{r['time']!r},{r['energy']!r}\n"
        for r in p.records()
    )
    job = make_job(admin, stages=8, microbatches=96, name="killed")
    admin.put(f"/jobs/{job}/profile", content=csv_text, headers={"content-type": "text/csv"})
    assert admin.post(f"/jobs/{job}/frontier").status_code == 202
    for _ in range(1200):
        st = admin.get(f"/jobs/{job}/frontier", params={"points": False}).json()
        if st.get("worker_pid"):
            os.kill(int(st["worker_pid"]), signal.SIGKILL)
            break
        time.sleep(0.05)
    st = wait_frontier(admin, job, timeout=120)
    assert st["status"] == "failed" and "cancel" not in st["error"], st
    return job


def _until(what: Any, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (got := what()):
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.1)
    return got


def _labels_in_rule_tests() -> dict[str, set[frozenset[str]]]:
    """Per server metric, the label-name sets the unit tests' input series give it."""
    tests = yaml.safe_load((PROMETHEUS / "alerts.test.yml").read_text())
    out: dict[str, set[frozenset[str]]] = {}
    for case in tests["tests"]:
        for series in case["input_series"]:
            m = re.fullmatch(r"(perseus_[a-z_]+)(?:\{(.*)\})?", series["series"])
            if m is None or m.group(1).startswith("perseus_gpud_"):
                continue
            names = frozenset(re.findall(r'(\w+)="', m.group(2) or ""))
            out.setdefault(m.group(1), set()).add(names - SCRAPE_LABELS)
    return out


def test_the_server_exports_what_the_alert_rules_read(
    admin: tuple[httpx.Client, ServerProcess], small_csv: str
) -> None:
    http, srv = admin
    team_a = _tenant(http, "team-a")
    team_b = _tenant(http, "team-b")
    with team_a, team_b, grpc.insecure_channel(srv.grpc_target) as channel:
        stub = pb_grpc.PlanServiceStub(channel)
        a, cred_a = _solved(team_a, small_csv, "llama")
        b, cred_b = _solved(team_b, small_csv, "gpt")
        killed = _failed_solve(http)
        # team-a is guaranteed its job's least-power draw; the budget fits a alone, not b too.
        low = min(p["average_power"] for p in http.get(f"/jobs/{a}/frontier").json()["points"])
        r = http.patch("/tenants/team-a", json={"guaranteed_watts": 1.05 * low})
        assert r.status_code == 200, r.text
        streams = _run(stub, a, cred_a)
        r = http.put("/power-budget", json={"watts": 1.6 * low})
        assert r.status_code == 200 and r.json()["feasible"], r.text
        streams += _run(stub, b, cred_b)
        _until(lambda: not http.get("/power-budget").json()["feasible"])
        page = http.get("/metrics").text
        for s in streams:
            s.cancel()
    fams = {f.name: f for f in text_string_to_metric_families(page)}

    def value(metric: str, /, **labels: str) -> float:
        (got,) = [s.value for s in fams[metric].samples if labels.items() <= s.labels.items()]
        return got

    assert value("perseus_leader") == 1
    assert value("perseus_job_frontier_failed", perseus_job=killed) == 1
    assert value("perseus_job_frontier_failed", perseus_job=a) == 0
    assert value("perseus_tenant_power_budget_feasible", tenant="team-a") == 1
    assert value("perseus_tenant_power_budget_feasible", tenant="team-b") == 0
    assert value("perseus_job_info", perseus_job=b, name="gpt", tenant="team-b") == 1
    assert value("perseus_connected_ranks", perseus_job=a) == 2
    # Prometheus's job label is the scrape's: no series of the server carries one.
    carrying = sorted({f.name for f in fams.values() for s in f.samples if "job" in s.labels})
    assert carrying == [], f"series with a `job` label (Prometheus's own): {carrying}"
    # What the rules' unit tests feed is what the server writes.
    exported = {re.sub(r"_total$", "", n) for n in re.findall(r"^# TYPE (\S+)", page, re.M)}
    for name, label_sets in _labels_in_rule_tests().items():
        family = fams.get(re.sub(r"_total$", "", name))
        assert re.sub(r"_total$", "", name) in exported and family is not None, name
        written = {frozenset(s.labels) - {"le"} for s in family.samples}
        if written:
            assert label_sets <= written, (name, label_sets, written)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _prometheus(tmp_path: Path, target: str, read_token: str) -> tuple[subprocess.Popen[str], str]:
    """A real Prometheus scraping ``target`` every second with the shipped rules."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("prometheus not installed (Debian's prometheus package; scripts/setup adds it)")
    shutil.copy(PROMETHEUS / "alerts.yml", tmp_path / "alerts.yml")
    (tmp_path / "token").write_text(read_token)
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": ["alerts.yml"],
        "scrape_configs": [
            {
                "job_name": "perseus",
                "authorization": {"credentials_file": str(tmp_path / "token")},
                "static_configs": [{"targets": [target]}],
            }
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    url = f"127.0.0.1:{_free_port()}"
    with (tmp_path / "prometheus.log").open("w") as log:  # the child keeps its own copy
        proc = subprocess.Popen(
            [binary, f"--config.file={tmp_path / 'prometheus.yml'}", f"--web.listen-address={url}",
             f"--storage.tsdb.path={tmp_path / 'data'}"],
            stdout=subprocess.DEVNULL, stderr=log, text=True,
        )  # fmt: skip
    return proc, f"http://{url}"


def _firing(prometheus: str) -> list[dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"{prometheus}/api/v1/alerts", timeout=5) as r:
            alerts = json.load(r)["data"]["alerts"]
    except OSError:
        return []  # not listening yet
    return [a["labels"] for a in alerts if a["state"] == "firing"]


def test_a_real_prometheus_fires_a_tenants_alert_from_a_real_server(
    admin: tuple[httpx.Client, ServerProcess], tmp_path: Path
) -> None:
    http, srv = admin
    read = http.post("/credentials", json={"scope": "read"}).json()["credential"]
    proc, prometheus = _prometheus(tmp_path, srv.http_url.removeprefix("http://"), read)
    try:
        with _tenant(http, "team-c") as team_c:
            job = _failed_solve(team_c)
        fired = _until(
            lambda: [a for a in _firing(prometheus) if a["alertname"] == "PerseusSolvesFailing"],
            timeout=60,
        )
        assert fired == [
            {
                "alertname": "PerseusSolvesFailing",
                "severity": "warning",
                "job": "perseus",  # Prometheus's own: the scrape's, not overwritten
                "instance": srv.http_url.removeprefix("http://"),
                "perseus_job": job,
                "name": "killed",
                "tenant": "team-c",
            }
        ]
        assert "PerseusNoLeader" not in {a["alertname"] for a in _firing(prometheus)}
    finally:
        proc.terminate()
        proc.wait(timeout=30)
