"""The numba cache (``perseus.kernels.cache``): where the compiled kernels go, and what is kept.

A read-only install gets a writable cache seeded with the up-to-date kernels; stale caches are
dropped.
"""

from __future__ import annotations

from pathlib import Path

from perseus.kernels import drop_stale_caches
from perseus.kernels.cache import cache_dir_for, configure_cache


def test_a_read_only_install_gets_a_seeded_writable_cache(tmp_path: Path) -> None:
    """A read-only install gets a writable numba cache, seeded with the compiled kernels.

    When the package's ``__pycache__`` cannot be written, numba's cache goes to the first
    writable root, seeded with the up-to-date compiled kernels (stale ones are not copied).
    """
    from numba.core import config

    pkg = tmp_path / "pkg"
    (pkg / "__pycache__").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "k.py").write_text("")
    fresh = pkg / "__pycache__" / "k.f-1.py311.nbi"
    stale = pkg / "__pycache__" / "k.g-1.py311.nbi"
    fresh.write_text("index")
    stale.write_text("old")
    import os

    os.utime(pkg / "k.py", (2_000, 2_000))
    os.utime(stale, (1_000, 1_000))
    bad, good = tmp_path / "bad", tmp_path / "good"
    before = config.CACHE_DIR
    try:
        root = configure_cache(pkg, writable=lambda p: p == good, roots=[bad, good])
        assert root == good and config.CACHE_DIR == str(good)
        target = cache_dir_for(pkg, good)
        assert (target / fresh.name).read_text() == "index"
        assert not (target / stale.name).exists()
        config.CACHE_DIR = before
        assert configure_cache(pkg, writable=lambda p: True) is None  # in-tree: unchanged
        assert config.CACHE_DIR == before
    finally:
        config.CACHE_DIR = before


def test_stale_numba_caches_are_dropped(tmp_path: Path) -> None:
    """Cache files older than a source beside them go; newer ones stay."""
    cache = tmp_path / "__pycache__"
    cache.mkdir()
    (tmp_path / "a.py").write_text("")
    (tmp_path / "b.py").write_text("")
    old, new = cache / "a.f-1.py311.nbi", cache / "b.g-1.py311.1.nbc"
    keep = cache / "a.cpython-311.pyc"
    for f in (old, new, keep):
        f.write_text("")
    import os

    os.utime(old, (1_000, 1_000))
    os.utime(keep, (1_000, 1_000))
    os.utime(tmp_path / "a.py", (2_000, 2_000))
    os.utime(tmp_path / "b.py", (3_000, 3_000))
    os.utime(new, (4_000, 4_000))
    assert drop_stale_caches(tmp_path) == 1
    assert not old.exists() and new.exists() and keep.exists()
    assert drop_stale_caches(tmp_path / "nowhere") == 0
