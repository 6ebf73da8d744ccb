"""``GET /jobs`` paging survives a deleted cursor job, and ends cleanly.

It goes on when the job its cursor names is deleted meanwhile, and a page that ends exactly at the
last job gives no ``next`` cursor.
"""

from __future__ import annotations

import math
from pathlib import Path

import httpx

from perseus_server import ServerProcess

from ..conftest import make_job


def _ids(page: dict) -> list[str]:  # type: ignore[type-arg]
    return [j["id"] for j in page["jobs"]]


def test_listing_continues_after_the_cursors_job_is_deleted(http: httpx.Client) -> None:
    for j in _ids(http.get("/jobs", params={"limit": 1000}).json()):
        assert http.delete(f"/jobs/{j}").status_code == 204
    made = [make_job(http) for _ in range(5)]
    first = http.get("/jobs", params={"limit": 2}).json()
    assert _ids(first) == made[:2]
    assert http.delete(f"/jobs/{made[1]}").status_code == 204  # the job the cursor names
    second = http.get("/jobs", params={"limit": 2, "after": first["next"]})
    assert second.status_code == 200, second.text
    assert _ids(second.json()) == made[2:4]
    # the page also goes on when the deleted job was the last one left before it
    assert http.delete(f"/jobs/{made[3]}").status_code == 204
    third = http.get("/jobs", params={"limit": 2, "after": second.json()["next"]}).json()
    assert _ids(third) == made[4:] and "next" not in third
    # an older cursor, a plain job id, still works while its job exists
    old = http.get("/jobs", params={"limit": 2, "after": made[0]}).json()
    assert _ids(old) == [made[2], made[4]] and "next" not in old
    # nonsense is a 422 naming the field
    for bad in ("nope", "zz.abc", made[1]):
        r = http.get("/jobs", params={"after": bad})
        assert r.status_code == 422 and "after" in r.text


def test_a_page_that_ends_at_the_last_job_has_no_next(tmp_path: Path) -> None:
    n = 6
    with (
        ServerProcess(tmp_path / "perseus.db") as srv,
        httpx.Client(base_url=srv.http_url, timeout=30.0) as http,
    ):
        ids = [make_job(http, name=f"job {i}") for i in range(n)]
        for limit in range(1, n + 2):
            seen: list[str] = []
            pages = 0
            params: dict[str, str | int] = {"limit": limit}
            while True:
                page = http.get("/jobs", params=params).json()
                pages += 1
                assert page["jobs"], f"limit {limit}: an empty page {pages}"
                seen += [j["id"] for j in page["jobs"]]
                if "next" not in page:
                    break
                assert pages < n + 1, f"limit {limit}: the listing does not end"
                params = {"limit": limit, "after": page["next"]}
            assert seen == ids, limit
            assert pages == math.ceil(n / limit), (limit, pages)
        # the exact fit in one page, and the last page of an exact division
        assert "next" not in http.get("/jobs", params={"limit": n}).json()
        first = http.get("/jobs", params={"limit": n // 2}).json()
        assert "next" in first
        last = http.get("/jobs", params={"limit": n // 2, "after": first["next"]}).json()
        assert [j["id"] for j in last["jobs"]] == ids[n // 2 :] and "next" not in last
