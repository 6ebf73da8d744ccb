"""Files the root daemon writes (its lock record, the metrics textfile).

They are written safely in a directory that others may be able to write.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile

__all__ = ["replace_file"]


def replace_file(path: str, text: str, mode: int = 0o644) -> None:
    """Write ``text`` to ``path`` atomically and safely in a directory others may write.

    A new file of an unpredictable name (``mkstemp``: created with ``O_EXCL``, so no planted
    file or link is followed), written, flushed, then renamed over ``path``. Raises ``OSError``
    when ``path`` is a symbolic link (or not a regular file), which is never followed or
    replaced.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISREG(st.st_mode):
            kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a regular file"
            raise OSError(f"{path} is {kind}; refusing to replace it")
    directory, name = os.path.split(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            os.fchmod(f.fileno(), mode)
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
