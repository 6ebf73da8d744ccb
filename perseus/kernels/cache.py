"""Where numba keeps the compiled kernels, so that no process pays for compiling them twice.

numba (``cache=True``) writes each compiled kernel beside its source, in ``__pycache__``, and
loads it from there in later processes. When that directory is not writable (a read-only
install, as in a container image), numba falls back to a per-user cache directory, which starts
empty: the first process of every user, or every process when the home directory is not
writable either, compiles everything again. :func:`configure_cache` points numba at a writable
cache directory in that case and seeds it with the kernels compiled ahead of time beside the
source (by ``python -m perseus.kernels.warm`` at install time), so a read-only install loads
them instead of compiling. numba keys each cache entry on its source file's contents, so a
seeded copy is used only while it matches.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Collection, Sequence
from pathlib import Path

__all__ = ["drop_stale_caches", "configure_cache", "cache_dir_for", "CACHE_SUFFIXES", "NO_KERNELS"]

#: numba's cache files: an index per function and one compiled object per signature.
CACHE_SUFFIXES = ("*.nbi", "*.nbc")


#: Modules of the kernels' package that define no kernel (editing them invalidates nothing).
NO_KERNELS = frozenset({"__init__.py", "cache.py", "warm.py"})


def drop_stale_caches(
    package: Path, cache: Path | None = None, exclude: Collection[str] = ()
) -> int:
    """Delete numba's cache files that are older than any ``*.py`` in ``package``; returns how many.

    The files are those in ``cache`` (default ``package/__pycache__``); the sources named in
    ``exclude`` do not count. numba keys each function's cache on its own source file only, so a
    kernel compiled with a callee from another module would otherwise keep the old callee after
    that module changes. Run once, before the kernels are imported.
    """
    sources = [p.stat().st_mtime for p in package.glob("*.py") if p.name not in exclude]
    if not sources:
        return 0
    newest = max(sources)
    dropped = 0
    for pattern in CACHE_SUFFIXES:
        for f in (cache or package / "__pycache__").glob(pattern):
            try:
                if f.stat().st_mtime < newest:
                    f.unlink()
                    dropped += 1
            except OSError:  # another process got there first, or the directory is read-only
                pass
    return dropped


def _writable(path: Path) -> bool:
    try:
        path.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
        return True
    except OSError:
        return False


def cache_dir_for(package: Path, root: Path) -> Path:
    """Where numba, given ``NUMBA_CACHE_DIR=root``, keeps the kernels of ``package``.

    Numba's own naming: the directory's name and a hash of its path.
    """
    from numba.core.caching import UserProvidedCacheLocator

    sub = UserProvidedCacheLocator.get_suitable_cache_subpath(str(package / "__init__.py"))
    return root / sub


def _user_roots() -> list[Path]:
    roots = []
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        roots.append(Path(xdg) / "perseus" / "numba")
    home = os.environ.get("HOME")
    if home:
        roots.append(Path(home) / ".cache" / "perseus" / "numba")
    uid = os.getuid() if hasattr(os, "getuid") else 0
    roots.append(Path(tempfile.gettempdir()) / f"perseus-numba-{uid}")
    return roots


def configure_cache(
    package: Path,
    *,
    writable: Callable[[Path], bool] = _writable,
    roots: Sequence[Path] | None = None,
) -> Path | None:
    """Make the kernels of ``package`` load from a writable cache.

    Returns the cache root chosen, or ``None`` when nothing needed changing (``NUMBA_CACHE_DIR``
    is set, or ``package/__pycache__`` is writable).

    Otherwise numba's cache directory becomes the first writable of
    ``$XDG_CACHE_HOME/perseus/numba``, ``~/.cache/perseus/numba`` and
    ``$TMPDIR/perseus-numba-<uid>``, seeded with the up-to-date cache files from
    ``package/__pycache__`` that it lacks or holds older copies of. Must run before the kernels
    are imported (numba picks a kernel's cache when it is defined). ``writable`` (whether a
    directory can be written, creating it) and ``roots`` (the candidates, in order) are for
    tests.
    """
    from numba.core import config

    if os.environ.get("NUMBA_CACHE_DIR") or getattr(config, "CACHE_DIR", ""):
        return None
    built = package / "__pycache__"
    if writable(built):
        return None
    root = next((r for r in (_user_roots() if roots is None else roots) if writable(r)), None)
    if root is None:
        return None
    target = cache_dir_for(package, root)
    target.mkdir(parents=True, exist_ok=True)
    newest = max(
        (p.stat().st_mtime for p in package.glob("*.py") if p.name not in NO_KERNELS), default=0.0
    )
    for pattern in CACHE_SUFFIXES:
        for f in built.glob(pattern):
            try:
                st = f.stat()
                dest = target / f.name
                if st.st_mtime >= newest and (
                    not dest.exists() or dest.stat().st_mtime < st.st_mtime
                ):
                    tmp = target / f".{f.name}.{os.getpid()}"
                    shutil.copy2(f, tmp)
                    os.replace(tmp, dest)  # atomic: a concurrent reader sees old or new
            except OSError:
                pass
    drop_stale_caches(package, target, NO_KERNELS)
    setattr(config, "CACHE_DIR", str(root))  # noqa: B010 (numba sets it at import)
    return root
