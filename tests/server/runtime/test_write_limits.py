"""Each tenant's writes paced by a token bucket (``runtime/write_limits.py``).

The bucket on an injected clock; the real server's 429 for a tenant over its rate is
``tests/server/service/test_tenants_limits.py``.
"""

from __future__ import annotations

import math

import pytest

from perseus_server.runtime.write_limits import WRITE_METHODS, RateLimited, WriteLimits


def test_a_tenant_writes_its_burst_then_waits_for_the_refill() -> None:
    now = [100.0]
    limits = WriteLimits(rate=2.0, burst=3, clock=lambda: now[0])
    assert [limits.take("a") for _ in range(3)] == [None, None, None]
    assert limits.take("a") == pytest.approx(0.5)  # one token at 2 per second
    assert limits.take("b") is None  # another tenant's bucket is full
    now[0] += 0.25
    assert limits.take("a") == pytest.approx(0.25)
    now[0] += 0.25
    assert limits.take("a") is None
    now[0] += 60.0  # refilled up to the burst, never beyond it
    assert [limits.take("a") for _ in range(4)][-1] == pytest.approx(0.5)


def test_rate_zero_is_no_limit() -> None:
    limits = WriteLimits(rate=0, burst=1, clock=lambda: 0.0)
    assert all(limits.take("a") is None for _ in range(1000))


@pytest.mark.parametrize(("rate", "burst"), [(-1.0, 5), (math.nan, 5), (math.inf, 5), (1.0, 0)])
def test_bad_settings_are_refused(rate: float, burst: int) -> None:
    with pytest.raises(ValueError, match="write limits: rate >= 0 and burst >= 1"):
        WriteLimits(rate, burst)


def test_the_refusal_is_a_429_naming_the_tenant_with_whole_seconds_to_wait() -> None:
    limits = WriteLimits(rate=0.5, burst=5)
    refusal = limits.refusal("team-a", 0.2)
    assert isinstance(refusal, RateLimited) and refusal.status == 429
    assert refusal.headers() == {"Retry-After": "1"}
    assert "team-a" in str(refusal) and "5 writes" in str(refusal)
    problem = refusal.problem()
    assert problem["field"] == "tenant" and problem["retry_after"] == 1
    assert limits.refusal("team-a", 2.01).headers() == {"Retry-After": "3"}
    assert WRITE_METHODS == {"POST", "PUT", "PATCH", "DELETE"}
