"""``GET /ui`` in a real headless Chromium (Selenium) against a real ``perseus serve``.

With auth on, two solved jobs whose ranks reported energy over gRPC, and a cluster power budget: the
page asks for the credential once, shows both jobs' numbers and the allocation, refreshes by itself,
and the browser console stays free of errors and warnings.

Skips, naming what is missing, without Chromium, its driver or Selenium (CI installs them).
"""

from __future__ import annotations

import importlib.util
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from perseus_common.proto import perseus_pb2 as pb
from perseus_common.proto import perseus_pb2_grpc as pb_grpc
from perseus_server import ServerProcess

from ..conftest import register, solved_job

pytestmark = pytest.mark.slow

TOKEN = "ui-admin-token-0123456789"


def _chromium() -> tuple[str, str]:
    """(browser, driver) paths; skips naming what is missing."""
    missing = []
    browser = next(
        (p for p in ("/usr/bin/chromium", shutil.which("chromium"), shutil.which("chromium-browser")) if p and Path(p).exists()),
        None,
    )  # fmt: skip
    driver = next(
        (p for p in ("/usr/bin/chromedriver", shutil.which("chromedriver")) if p and Path(p).exists()),
        None,
    )  # fmt: skip
    if browser is None:
        missing.append("chromium (apt install chromium)")
    if driver is None:
        missing.append("chromedriver (apt install chromium-driver)")
    if importlib.util.find_spec("selenium") is None:
        missing.append("selenium (pip install selenium)")
    if missing:
        pytest.skip("the browser test needs " + ", ".join(missing))
    assert browser is not None and driver is not None
    return browser, driver


@pytest.fixture(scope="module")
def browser_paths() -> tuple[str, str]:
    return _chromium()


@pytest.fixture(scope="module")
def authed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    db = tmp_path_factory.mktemp("ui") / "perseus.db"
    with ServerProcess(db, token=TOKEN) as srv:
        yield srv


def _report(
    stub: pb_grpc.PlanServiceStub,
    meta: Any,
    job: str,
    ranks: dict[int, str],
    version: int,
    seconds: float,
    energy: float,
    n: int,
    start: int,
) -> None:
    for rank_id in ranks.values():
        reps = [
            pb.IterationReport(job_id=job, rank_id=rank_id, iteration=start + i,
                               iteration_time=seconds, plan_version=version, energy=energy)
            for i in range(n)
        ]  # fmt: skip
        stub.ReportIterations(iter(reps), metadata=meta, timeout=10)


def _wait(pred: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            got = pred()
        except Exception:  # noqa: BLE001 - the page is being redrawn: try again
            got = None
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"the page never showed {what}")
        time.sleep(0.1)


def test_the_operators_page_in_a_real_browser(
    browser_paths: tuple[str, str], authed: ServerProcess, small_csv: str
) -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

    srv = authed
    http = httpx.Client(base_url=srv.http_url, headers=srv.headers, timeout=30.0)
    anon = httpx.Client(base_url=srv.http_url, timeout=10.0)
    channel = grpc.insecure_channel(srv.grpc_target)
    stub = pb_grpc.PlanServiceStub(channel)
    meta = srv.grpc_metadata
    try:
        # the page is public, its data is not
        page = anon.get("/ui")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert 'content="required"' in page.text
        assert anon.get("/ui/app.js").headers["content-type"].startswith("text/javascript")
        assert anon.get("/jobs").status_code == 401
        assert anon.post("/ui").status_code == 401  # only GET/HEAD of the page bypass the gate

        a = solved_job(http, small_csv, data_parallel=2, name="<b>alpha</b>")
        b = solved_job(http, small_csv, microbatches=6, name="beta")
        top = {
            j: http.get(f"/jobs/{j}/frontier").json()["points"][0]["average_power"] for j in (a, b)
        }
        ranks = {  # started: the jobs draw on a power budget
            a: {g: register(stub, a, g, g % 2, g // 2, metadata=meta).rank_id for g in range(4)},
            b: {g: register(stub, b, g, g, metadata=meta).rank_id for g in range(2)},
        }
        budget = http.put("/power-budget", json={"watts": 0.93 * sum(top.values())})
        assert budget.status_code == 200, budget.text
        for j, e in ((a, 400.0), (b, 300.0)):
            st = http.get(f"/jobs/{j}/status").json()
            t = st["plan"]["pipelines"][0]["time"]
            _report(stub, meta, j, ranks[j], st["plan"]["version"], t, e, 3, 0)

        opts = webdriver.ChromeOptions()
        opts.binary_location = browser_paths[0]
        for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--window-size=1400,1200", "--disable-extensions"):  # fmt: skip
            opts.add_argument(arg)
        opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        driver = webdriver.Chrome(service=Service(browser_paths[1]), options=opts)
        try:
            _check_page(driver, By, srv, http, stub, meta, a, b, ranks, small_csv)
        finally:
            driver.quit()
    finally:
        channel.close()
        http.close()
        anon.close()


#: Everything the checks read from the page, in one script run: the page redraws itself every
#: half second, and a script runs between two redraws, never during one.
SNAPSHOT = """
const val = (root, sel) => {
  const e = root.querySelector(sel);
  return e ? {text: e.textContent, value: e.getAttribute('data-value')} : null;
};
const out = {jobs: {}, alloc: {}, login: !document.getElementById('login').hidden,
             loaded: Number(document.body.dataset.loaded || 0)};
for (const c of document.querySelectorAll('section.job')) {
  out.jobs[c.dataset.job] = {
    name: val(c, '.job-name'), name_markup: c.querySelectorAll('.job-name *').length,
    power: val(c, '.measured-power'), saved: val(c, '.energy-saved'),
    plan: val(c, '.plan-power'), share: val(c, '.budget-share'),
    iterations: val(c, '.iterations'), constraint: val(c, '.constraint'),
    life: val(c, '.lifecycle'),
    curve: c.querySelectorAll('svg.frontier polyline.curve').length,
    deployed: [...c.querySelectorAll('svg.frontier circle.deployed')].map(e => +e.dataset.index),
    timeline: c.querySelectorAll('svg.timeline polyline').length,
    caption: (c.querySelector('svg.timeline .tl-caption') || {}).textContent || null,
    rows: [...c.querySelectorAll('table.pipelines tbody tr')].map(r => ({
      point: r.querySelector('.point').textContent, why: r.querySelector('.why').textContent,
      straggler: r.querySelector('.straggler').textContent})),
  };
}
for (const tr of document.querySelectorAll('#allocation tbody tr')) {
  out.alloc[tr.dataset.job] = {watts: Number(tr.querySelector('.alloc-watts').dataset.value),
                               point: tr.querySelector('.alloc-point').textContent};
}
const err = document.getElementById('error');
out.error = err.hidden ? null : err.textContent;
out.budget = {hidden: document.getElementById('budget').hidden,
              ...val(document, '#budget-watts')};
out.left_out = document.getElementById('budget-left-out').textContent;
out.feasible = document.getElementById('budget-feasible').getAttribute('data-feasible');
return out;
"""


def _number(v: dict[str, Any] | None) -> float | None:
    return None if v is None or v["value"] is None else float(v["value"])


def _check_page(
    driver: Any, By: Any, srv: ServerProcess, http: httpx.Client, stub: Any, meta: Any,
    a: str, b: str, ranks: dict[str, dict[int, str]], small_csv: str,
) -> None:  # fmt: skip
    def page() -> dict[str, Any]:
        return dict(driver.execute_script(SNAPSHOT))

    def power(job: str) -> float | None:
        got = page()["jobs"].get(job)
        return None if got is None else _number(got["power"])

    driver.get(srv.http_url + "/ui?refresh=0.5")
    # auth is on: the page asks for the credential before any data call
    _wait(lambda: driver.find_element(By.ID, "login").is_displayed(), "the login form")
    assert page()["jobs"] == {}
    driver.find_element(By.ID, "token").send_keys(TOKEN)
    driver.find_element(By.ID, "login-submit").click()
    _wait(lambda: power(a) and power(b), "measured power")

    shown = page()
    pb_view = http.get("/power-budget").json()
    for job in (a, b):
        st = http.get(f"/jobs/{job}/status").json()
        m, got = st["measured"], shown["jobs"][job]
        assert _number(got["power"]) == pytest.approx(m["average_power"], rel=1e-9)
        assert got["power"]["text"] == f"{m['average_power']:.1f} W"
        assert _number(got["saved"]) == pytest.approx(m["energy_saved"], rel=1e-9)
        assert _number(got["plan"]) == pytest.approx(st["plan"]["average_power"], rel=1e-9)
        assert _number(got["share"]) == pytest.approx(st["power_budget"]["watts"], rel=1e-9)
        assert got["iterations"]["text"] == str(m["iterations"])
        assert got["constraint"]["text"] == st["plan"]["constraint"]
        # the frontier with its deployed point, the per-pipeline plans and why
        assert got["curve"] == 1
        assert set(got["deployed"]) == {p["index"] for p in st["plan"]["pipelines"]}
        # the deployed plan's power over two iterations, its swing in the caption
        assert got["timeline"] == 1
        assert f"swing {st['plan']['power_timeline']['swing']:.2f}" in got["caption"]
        assert len(got["rows"]) == len(st["pipelines"])
        for row, p in zip(got["rows"], st["plan"]["pipelines"], strict=True):
            assert row["point"] == str(p["index"]) and row["why"] == p["reason"]
            assert "power budget" in p["reason"]
        # the allocation
        share = next(j for j in pb_view["jobs"] if j["id"] == job)
        assert shown["alloc"][job]["watts"] == pytest.approx(share["watts"], rel=1e-9)
        assert shown["alloc"][job]["point"] == str(share["point"])
    assert shown["error"] is None
    assert set(shown["alloc"]) == {a, b} and not shown["budget"]["hidden"]
    assert _number(shown["budget"]) == pytest.approx(pb_view["watts"])
    assert shown["budget"]["text"] == f"{pb_view['watts']:.1f} W"
    # a job's name is text, never markup
    assert shown["jobs"][a]["name"]["text"] == "<b>alpha</b>"
    assert shown["jobs"][a]["name_markup"] == 0

    # it refreshes by itself: new reports for job b, a straggler on job a
    st = http.get(f"/jobs/{b}/status").json()
    t = st["plan"]["pipelines"][0]["time"]
    _report(stub, meta, b, ranks[b], st["plan"]["version"], t, 500.0, 3, 10)
    want = http.get(f"/jobs/{b}/status").json()["measured"]["average_power"]
    assert want != pytest.approx(_number(shown["jobs"][b]["power"]))
    _wait(lambda: power(b) == pytest.approx(want, rel=1e-9), "the new power")
    r = http.post(f"/jobs/{a}/stragglers", json={"pipeline": 1, "slowdown": 0.2})
    assert r.status_code == 200, r.text
    _wait(lambda: "reported" in page()["jobs"][a]["rows"][1]["straggler"], "the straggler")
    # a slow link on job a's pipeline 0 (its forward transfers 10 times slower): named in its row
    st = http.get(f"/jobs/{a}/status").json()
    version, t = st["plan"]["version"], st["plan"]["pipelines"][0]["time"]
    for i, seconds in enumerate([0.002] * 3 + [0.02] * 3):
        transfers = [
            pb.TransferMeasurement(boundary=0, direction="forward", microbatch=m, time=seconds)
            for m in range(4)
        ]
        rep = pb.IterationReport(job_id=a, rank_id=ranks[a][0], iteration=20 + i,
                                 iteration_time=t, plan_version=version, transfers=transfers)  # fmt: skip
        stub.ReportIterations(iter([rep]), metadata=meta, timeout=10)
    _wait(
        lambda: "slow link 0 forward 20.00 ms ×10.00" in page()["jobs"][a]["rows"][0]["straggler"],
        "the link",
    )
    assert page()["jobs"][b]["life"]["text"] == "active" and page()["feasible"] == "true"

    # a finished job leaves the budget: the page shows its state and the budget's left-out list
    assert http.post(f"/jobs/{b}/finish").status_code == 200
    _wait(lambda: page()["jobs"][b]["life"]["text"] == "finished", "the finished job")
    _wait(lambda: set(page()["alloc"]) == {a}, "the allocation without the finished job")
    assert "beta" in page()["left_out"] and page()["jobs"][b]["share"]["text"] == "none (finished)"

    # swing bounds: the timeline's caption names a rank whose GPU cannot hold its floor
    assert http.delete("/power-budget").status_code in (200, 204)
    d = solved_job(http, small_csv, name="delta")
    view = http.put(f"/jobs/{d}/plan", json={"slowdown": 0, "max_swing": 0.3}).json()
    for g in range(2):
        rank_id = register(stub, d, g, g, metadata=meta).rank_id
        held = pb.POWER_FLOOR_UNAVAILABLE if g == 1 else pb.POWER_FLOOR_HELD
        floor = pb.PowerFloorControl(state=held, reason="no power smoothing" if g else "",
                                     plan_swing=view["swing"]["plan_swing"])  # fmt: skip
        rep = pb.IterationReport(job_id=d, rank_id=rank_id, iteration=0, iteration_time=1.0,
                                 plan_version=view["version"], power_floor=floor)  # fmt: skip
        stub.ReportIterations(iter([rep]), metadata=meta, timeout=10)
    want = "1 rank(s) cannot hold a floor (rank 1: no power smoothing); there the plan alone "
    want += f"swings {view['swing']['plan_swing']:.2f}"
    _wait(lambda: want in (page()["jobs"][d]["caption"] or ""), "the rank without its floor")
    assert "with floors: swing" in page()["jobs"][d]["caption"]

    # the credential is kept for the tab: a reload does not ask again
    driver.refresh()
    _wait(lambda: power(a), "the page after a reload")
    assert page()["login"] is False and page()["error"] is None
    driver.save_screenshot(str(srv.db_path.parent / "ui.png"))

    # a tenant's credential: the page shows its tenant's jobs only
    assert http.post("/tenants", json={"id": "team-ui"}).status_code == 201
    issued = http.post("/credentials", json={"scope": "tenant-read", "tenant": "team-ui"})
    body = {"stages": 2, "microbatches": 4, "blocking_power": 70.0, "name": "gamma"}
    mine = http.post("/jobs", json={**body, "tenant": "team-ui"}).json()["id"]
    driver.execute_script("window.sessionStorage.clear();")
    driver.refresh()
    _wait(lambda: driver.find_element(By.ID, "login").is_displayed(), "the login form again")
    driver.find_element(By.ID, "token").send_keys(issued.json()["credential"])
    driver.find_element(By.ID, "login-submit").click()
    _wait(lambda: set(page()["jobs"]) == {mine}, "the tenant's job alone")
    assert page()["error"] is None and page()["budget"]["hidden"]

    logs = driver.get_log("browser")
    bad = [e for e in logs if e["level"] in ("SEVERE", "WARNING")]
    assert bad == [], bad
