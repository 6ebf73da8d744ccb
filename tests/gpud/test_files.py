"""``perseus_gpud.files``: a file replaced atomically, never through a link.

The metrics textfile and the lock record are written this way into directories others may write.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from perseus_gpud.files import replace_file


def test_the_textfile_never_follows_a_link(tmp_path: Path) -> None:
    """The textfile's directory may be writable by others.

    A link planted at the target is refused (the file it points to untouched), and a link
    planted at any name the daemon might use for its temporary file is never followed (the name
    is new each time, made O_EXCL).
    """
    victim = tmp_path / "victim"
    victim.write_text("root's file\n")
    target = tmp_path / "gpud.prom"
    target.symlink_to(victim)
    with pytest.raises(OSError, match="is a symbolic link"):
        replace_file(str(target), "metrics\n")
    assert victim.read_text() == "root's file\n" and target.is_symlink()
    target.unlink()
    # The old predictable names, planted: none is opened.
    for name in (f"gpud.prom.{os.getpid()}.tmp", "gpud.prom.tmp", ".gpud.prom.tmp"):
        (tmp_path / name).symlink_to(victim)
    replace_file(str(target), "metrics\n")
    assert target.read_text() == "metrics\n" and not target.is_symlink()
    assert oct(target.stat().st_mode & 0o777) == oct(0o644)
    assert victim.read_text() == "root's file\n"
    assert sorted(p.name for p in tmp_path.iterdir() if not p.is_symlink()) == [
        "gpud.prom",
        "victim",
    ]


def test_the_file_is_replaced_whole_with_the_mode_asked(tmp_path: Path) -> None:
    target = tmp_path / "record.json"
    replace_file(str(target), "old")
    replace_file(str(target), "new", mode=0o600)
    assert target.read_text() == "new"
    assert oct(target.stat().st_mode & 0o777) == oct(0o600)
    assert [p.name for p in tmp_path.iterdir()] == ["record.json"]  # no temporary file left
