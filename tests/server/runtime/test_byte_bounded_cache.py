"""The least-recently-used cache bounded in bytes and entries (``runtime/byte_bounded_cache.py``)."""

from __future__ import annotations

from perseus_server.runtime.byte_bounded_cache import ByteBoundedCache


def test_byte_bounded_cache() -> None:
    cache: ByteBoundedCache[int, bytes] = ByteBoundedCache(100, len, max_entries=10)
    for i in range(50):
        cache[i] = b"x" * 30
        assert cache.bytes <= 100 and len(cache) <= 10
    assert cache.get(49) is not None and cache.get(0) is None
    cache.get(47)
    cache[99] = b"y" * 30  # evicts the least recently used, not 47
    assert cache.get(47) is not None
    cache[100] = b"z" * 1000  # larger than the budget: not kept
    assert cache.get(100) is None and cache.bytes <= 100


def test_replacing_a_key_counts_its_new_size_only() -> None:
    cache: ByteBoundedCache[str, bytes] = ByteBoundedCache(100, len)
    cache["a"] = b"x" * 40
    cache["a"] = b"x" * 10
    assert cache.bytes == 10 and len(cache) == 1 and "a" in cache
    cache["a"] = b"x" * 500  # too large: the old value goes too, nothing stale is served
    assert "a" not in cache and cache.bytes == 0
    cache["b"] = b"y" * 5
    cache.clear()
    assert len(cache) == 0 and cache.bytes == 0 and cache.get("b") is None
