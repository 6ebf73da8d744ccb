"""The rate limit on repeated log lines (``runtime/logs.py``)."""

from __future__ import annotations

import logging

from perseus_server.runtime.logs import RateLimit


def test_repeated_log_lines_are_rate_limited() -> None:
    now = [0.0]
    limit = RateLimit(burst=3, window=10.0, clock=lambda: now[0])

    def record(msg: str) -> logging.LogRecord:
        return logging.LogRecord("perseus", logging.WARNING, __file__, 1, msg, None, None)

    passed = [limit.filter(record("accept failed: %s")) for _ in range(100)]
    assert sum(passed) == 3
    assert limit.filter(record("another line"))
    now[0] = 11.0
    rec = record("accept failed: %s")
    assert limit.filter(rec)
    assert "97 similar lines suppressed" in str(rec.msg)
