"""``GET /docs`` in a real headless Chromium (Selenium) against a real ``perseus serve``.

With auth on: Swagger UI loads from the server alone (every request the browser made, read from its
performance log, went to the server; the page's Content-Security-Policy names no other host), its
*Authorize* button takes the token, and *Try it out* → *Execute* on ``GET /jobs`` answers 200 with
the job the server holds, the request carrying the bearer credential.

Skips, naming what is missing, without Chromium, its driver or Selenium (CI installs them).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from perseus_server import ServerProcess

from .test_ui_browser import _chromium, _wait

pytestmark = pytest.mark.slow

TOKEN = "docs-admin-token-0123456789"
JOB = {"stages": 2, "microbatches": 4, "schedule": "1f1b", "blocking_power": 70.38, "name": "docs"}


@pytest.fixture(scope="module")
def authed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    db = tmp_path_factory.mktemp("docs") / "perseus.db"
    with ServerProcess(db, token=TOKEN) as srv:
        yield srv


def test_the_page_and_schema_are_public_and_say_how_to_authenticate(
    authed: ServerProcess,
) -> None:
    with httpx.Client(base_url=authed.http_url, timeout=30.0) as anon:
        page = anon.get("/docs")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        csp = page.headers["content-security-policy"]
        # no other host anywhere in the policy: every source is this origin (or inline data)
        sources = {s for d in csp.split(";") for s in d.split()[1:]}
        assert sources <= {"'self'", "'none'", "'unsafe-inline'", "data:"}, csp
        assert "script-src 'self';" in csp  # no inline or evaluated script
        assert "http" not in page.text  # every address in the page is relative
        for asset in ("docs/swagger-ui-bundle.js", "docs/swagger-ui.css", "docs/start.js"):
            assert asset in page.text
            r = anon.get("/" + asset)
            assert r.status_code == 200 and len(r.content) > 0, asset
        assert "validatorUrl: null" in anon.get("/docs/start.js").text
        doc = anon.get("/openapi.json").json()
        # the data stays behind the token
        assert anon.get("/jobs").status_code == 401
        assert anon.post("/docs").status_code == 401  # only GET/HEAD of the page bypass the gate
    assert doc["components"]["securitySchemes"]["bearer"] == {
        "type": "http",
        "scheme": "bearer",
        "description": doc["components"]["securitySchemes"]["bearer"]["description"],
    }
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            want = [] if path == "/healthz" else [{"bearer": []}]
            assert op["security"] == want, (method, path)


def test_swagger_ui_offline_with_the_token(authed: ServerProcess) -> None:
    browser, driver_path = _chromium()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

    with httpx.Client(base_url=authed.http_url, headers=authed.headers, timeout=30.0) as http:
        created = http.post("/jobs", json=JOB)
        assert created.status_code == 201, created.text
        job = created.json()["id"]

    opts = webdriver.ChromeOptions()
    opts.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,1200", "--disable-extensions"):  # fmt: skip
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=Service(driver_path), options=opts)
    try:
        _drive(driver, By, authed, job)
        requests = _requests(driver.get_log("performance"))
        logs = driver.get_log("browser")
    finally:
        driver.quit()

    # nothing left the server: every request the browser made went to it
    assert requests, "the performance log recorded no request"
    off = [u for u, _ in requests if not u.startswith((authed.http_url + "/", "data:", "blob:"))]
    assert off == [], off
    fetched = {u.removeprefix(authed.http_url).split("?")[0] for u, _ in requests}
    assert {"/docs", "/docs/swagger-ui-bundle.js", "/openapi.json", "/jobs"} <= fetched, fetched
    # the call the page made carried the credential the Authorize dialog took
    sent = [h for u, h in requests if u.startswith(authed.http_url + "/jobs?")]
    assert any({k.lower(): v for k, v in h.items()}.get("authorization") == f"Bearer {TOKEN}" for h in sent), sent  # fmt: skip
    bad = [e for e in logs if e["level"] in ("SEVERE", "WARNING")]
    assert bad == [], bad


def _drive(driver: Any, By: Any, srv: ServerProcess, job: str) -> None:
    def one(css: str) -> Any:
        return driver.find_element(By.CSS_SELECTOR, css)

    driver.get(srv.http_url + "/docs")
    _wait(lambda: one(".auth-wrapper button.authorize").is_displayed(), "the Authorize button")
    _wait(lambda: one("#operations-jobs-list_jobs_jobs_get"), "the GET /jobs operation")
    one(".auth-wrapper button.authorize").click()
    field = _wait(lambda: one(".modal-ux input"), "the credential field")
    field.send_keys(TOKEN)
    one(".modal-ux .auth-btn-wrapper button.authorize").click()
    _wait(lambda: one(".modal-ux .auth-btn-wrapper button.btn-done"), "the authorized dialog")
    one(".modal-ux .auth-btn-wrapper button.btn-done").click()

    one("#operations-jobs-list_jobs_jobs_get .opblock-summary-control").click()
    _wait(lambda: one("#operations-jobs-list_jobs_jobs_get .try-out__btn"), "Try it out").click()
    _wait(lambda: one("#operations-jobs-list_jobs_jobs_get button.execute"), "Execute").click()
    live = "#operations-jobs-list_jobs_jobs_get .live-responses-table tbody td.response-col_status"
    status = _wait(lambda: one(live).text.strip(), "the response's status")
    assert status.startswith("200"), status
    body = one("#operations-jobs-list_jobs_jobs_get .live-responses-table tbody td.response-col_description").text  # fmt: skip
    assert job in body, body
    driver.save_screenshot(str(srv.db_path.parent / "docs.png"))


def _requests(perf: list[dict[str, Any]]) -> list[tuple[str, dict[str, str]]]:
    """(URL, headers) of every request the browser sent, from its performance log."""
    out = []
    for entry in perf:
        msg = json.loads(entry["message"])["message"]
        if msg.get("method") == "Network.requestWillBeSent":
            req = msg["params"]["request"]
            out.append((req["url"], dict(req.get("headers", {}))))
    return out
