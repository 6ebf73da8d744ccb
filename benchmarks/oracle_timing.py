"""Can a tenant tell another tenant's job id from an unknown one by the time of the answer?

    python benchmarks/oracle_timing.py [--requests 2000] [--json]
    python benchmarks/oracle_timing.py --smoke        # the suite's (20 requests per case)

Starts ``perseus serve`` (a temporary database, an admin token) with two tenants; tenant B's job
holds a profile; tenant A's credential then calls, for each case below, the route naming B's job
(``foreign``) and an id of the same length no job has (``unknown``), interleaved at random, over
one kept-alive connection (a 20 MB body announced: a new connection each, the body never sent).
Prints, per case and side, the answer's status and the latency's median and 90th percentile
(µs, client side), their ratio, and the Mann-Whitney U test's p-value of the two samples
(small: the two can be told apart by time).
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
ADMIN = "oracle-benchmark-admin-token"
CSV = "stage,instruction,frequency,time,energy\n" + "".join(
    f"{s},{i},1410,{t},{e}\n"
    for s in (0, 1)
    for i, t, e in (("forward", 0.01, 2.0), ("backward", 0.02, 4.0))
)
#: ``(name, method, path template, body)``: the cases the issue found apart, and plain reads.
CASES = (
    ("GET /jobs/{id}", "GET", "/jobs/{id}", b""),
    ("GET /jobs/{id}/plan (no query)", "GET", "/jobs/{id}/plan", b""),
    ("GET /jobs/{id}/status", "GET", "/jobs/{id}/status", b""),
    ("PUT /jobs/{id}/profile (small)", "PUT", "/jobs/{id}/profile", CSV.encode()),
    ("PUT /jobs/{id}/profile (20 MB announced)", "PUT", "/jobs/{id}/profile", None),
)


def _raw(url: Any, method: str, path: str, token: str) -> tuple[int, float]:
    """A request announcing 20 MB and sending none of it: its status and latency (s)."""
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: {url.host}:{url.port}\r\nAuthorization: Bearer "
        f"{token}\r\nContent-Type: text/csv\r\nContent-Length: 20000000\r\n\r\n"
    ).encode()
    with socket.create_connection((url.host, url.port)) as s:
        t0 = time.perf_counter()
        s.sendall(head)
        data = b""
        while b"\r\n" not in data:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
        took = time.perf_counter() - t0
    return int(data.split(b" ")[1]) if data else 0, took


def measure(srv: Any, n: int) -> list[dict[str, Any]]:
    """Every case's two sides, ``n`` requests each, interleaved at random."""
    import httpx
    from scipy.stats import mannwhitneyu

    admin = httpx.Client(base_url=srv.http_url, headers={"Authorization": f"Bearer {ADMIN}"})
    for tenant in ("team-a", "team-b"):
        admin.post("/tenants", json={"id": tenant}).raise_for_status()
    token = admin.post("/credentials", json={"scope": "tenant", "tenant": "team-a"}).json()
    foreign = admin.post(
        "/jobs", json={"stages": 2, "microbatches": 2, "blocking_power": 70.0, "tenant": "team-b"}
    ).json()
    admin.put(
        f"/jobs/{foreign['id']}/profile", content=CSV, headers={"content-type": "text/csv"}
    ).raise_for_status()
    ids = {"foreign": foreign["id"], "unknown": foreign["id"][::-1]}
    assert admin.get(f"/jobs/{ids['unknown']}").status_code == 404
    caller = httpx.Client(
        base_url=srv.http_url, headers={"Authorization": f"Bearer {token['credential']}"}
    )
    rng = random.Random(7)
    rows = []
    for name, method, template, body in CASES:
        order = ["foreign", "unknown"] * n
        rng.shuffle(order)
        took: dict[str, list[float]] = {"foreign": [], "unknown": []}
        statuses: dict[str, set[int]] = {"foreign": set(), "unknown": set()}
        for side in order:
            path = template.replace("{id}", ids[side])
            if body is None:
                status, dt = _raw(httpx.URL(srv.http_url), method, path, token["credential"])
            else:
                t0 = time.perf_counter()
                status = caller.request(method, path, content=body).status_code
                dt = time.perf_counter() - t0
            took[side].append(dt * 1e6)
            statuses[side].add(status)
        p = float(mannwhitneyu(took["foreign"], took["unknown"]).pvalue)
        med = {s: statistics.median(v) for s, v in took.items()}
        p90 = {s: statistics.quantiles(v, n=10)[-1] for s, v in took.items()}
        rows.append(
            {
                "case": name,
                "requests_per_side": n,
                "status_foreign": sorted(statuses["foreign"]),
                "status_unknown": sorted(statuses["unknown"]),
                "median_us_foreign": med["foreign"],
                "median_us_unknown": med["unknown"],
                "p90_us_foreign": p90["foreign"],
                "p90_us_unknown": p90["unknown"],
                "median_ratio": med["foreign"] / med["unknown"],
                "mann_whitney_p": p,
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    """Run the measurement; print a table (or JSON)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2000, help="requests per case and side")
    ap.add_argument("--smoke", action="store_true", help="20 requests per case and side")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT / "server"))
    from perseus_server import ServerProcess

    n = 20 if args.smoke else args.requests
    with tempfile.TemporaryDirectory() as d, ServerProcess(Path(d) / "p.db", token=ADMIN) as srv:
        rows = measure(srv, n)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(
        f"{'case':<42} {'status f/u':>10} {'median µs f/u':>17} {'p90 µs f/u':>17} {'ratio':>6} {'p':>6}"
    )
    for r in rows:
        st = f"{'/'.join(map(str, r['status_foreign']))}/{'/'.join(map(str, r['status_unknown']))}"
        med = f"{r['median_us_foreign']:.0f}/{r['median_us_unknown']:.0f}"
        p90 = f"{r['p90_us_foreign']:.0f}/{r['p90_us_unknown']:.0f}"
        print(
            f"{r['case']:<42} {st:>10} {med:>17} {p90:>17} {r['median_ratio']:>6.3f} "
            f"{r['mann_whitney_p']:>6.3f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
