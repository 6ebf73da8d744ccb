"""Each tenant's writes, paced: a token bucket per tenant.

Every REST write (``POST``, ``PUT``, ``PATCH``, ``DELETE``) made with a credential bound to a
tenant takes a token from that tenant's bucket, which holds ``burst`` tokens and refills at
``rate`` per second. An empty bucket refuses the write with ``429 Too Many Requests`` and a
``Retry-After`` (whole seconds until a token is back), counted in
``perseus_refusals_total{tenant, reason="rate_limited"}``; the tenant's reads, other tenants and
the admin are not affected. The check comes before the request is authorized against its job,
so another tenant's job id and an unknown one are refused alike.

The defaults (``Limits.tenant_write_rate`` 20 per second, ``Limits.tenant_write_burst`` 200)
are far above what a team's tooling sends (a job's whole setup is a handful of writes); they
bound what one tenant's script gone wrong costs the others.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from perseus_server.domain.errors import ApiError

__all__ = ["RateLimited", "WriteLimits", "WRITE_METHODS"]

#: The methods that count as writes.
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class RateLimited(ApiError):
    """A tenant made more writes than its rate allows (its ``Retry-After`` in the answer)."""

    status = 429
    title = "Too many requests"

    def headers(self) -> dict[str, str]:
        """``Retry-After``: whole seconds until the tenant may write again."""
        return {"Retry-After": str(self.extra.get("retry_after", 1))}


class WriteLimits:
    """Per tenant, a bucket of ``burst`` writes refilled at ``rate`` per second (0: no limit)."""

    def __init__(
        self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if not (math.isfinite(rate) and rate >= 0) or burst < 1:
            raise ValueError(f"write limits: rate >= 0 and burst >= 1, got {rate}, {burst}")
        self.rate, self.burst, self.clock = float(rate), int(burst), clock
        self._buckets: dict[str, tuple[float, float]] = {}  # tenant -> (tokens, when)

    def take(self, tenant: str) -> float | None:
        """Take one write from ``tenant``'s bucket: None, or the seconds until one is back."""
        if self.rate <= 0:
            return None
        now = self.clock()
        tokens, then = self._buckets.get(tenant, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - then) * self.rate)
        if tokens < 1.0:
            self._buckets[tenant] = (tokens, now)
            return (1.0 - tokens) / self.rate
        self._buckets[tenant] = (tokens - 1.0, now)
        return None

    def refusal(self, tenant: str, wait: float) -> RateLimited:
        """The 429 for ``tenant`` (``Retry-After``: whole seconds, at least 1)."""
        retry = max(1, math.ceil(wait))
        return RateLimited(
            f"tenant {tenant!r} made more than {self.burst} writes at once or {self.rate:g} per "
            f"second (tenant_write_rate); retry after {retry} s",
            field="tenant",
            retry_after=retry,
        )
