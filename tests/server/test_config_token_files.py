"""A token file is taken only when it is a regular file that only its owner can access.

A token file is taken only when it is a regular file owned by the server's user or root and
accessible to its owner only; a symlink is resolved and its target checked the same way (issue #32
item 4: a token file replaced by a link to another user's 0600 file was taken, and that user's token
opened everything). A refused reload keeps the old token and says why.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import pytest

from perseus_server import config
from perseus_server.config import ServerConfig, read_token
from perseus_server.server import TokenFiles
from perseus_server.service.credentials import Credentials

#: An ordinary user's uid (nobody), the owner of the other user's file.
OTHER_UID = 65534


def _token_file(path: Path, token: str, mode: int = 0o600) -> Path:
    path.write_text(token + "\n")
    path.chmod(mode)
    return path


def _another_users(path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``path`` as another (ordinary) user's file.

    Chowned when running as root, else the server's user is made someone else (a file we own is
    then not the server user's).
    """
    if os.geteuid() == 0:
        os.chown(path, OTHER_UID, OTHER_UID)
    else:
        monkeypatch.setattr(config.os, "geteuid", lambda: os.getuid() + 1)
    return path


def test_a_link_to_another_users_file_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    theirs = _another_users(_token_file(tmp_path / "theirs", "their-token-0123"), monkeypatch)
    link = tmp_path / "token"
    link.symlink_to(theirs)
    with pytest.raises(ValueError, match="owned by uid") as e:
        read_token(link)
    assert str(theirs) in str(e.value)  # names the target it resolved to
    with pytest.raises(ValueError, match="owned by uid"):
        read_token(theirs)  # and the file itself, linked or not


def test_a_link_to_a_file_of_the_servers_user_is_taken_and_checked_the_same_way(
    tmp_path: Path,
) -> None:
    ours = _token_file(tmp_path / "ours", "our-token-0123")
    link = tmp_path / "token"
    link.symlink_to(ours)
    assert read_token(link) == "our-token-0123"
    ours.chmod(0o620)  # group-writable target: refused through the link too
    with pytest.raises(ValueError, match="chmod 600"):
        read_token(link)


def test_a_fifo_or_a_directory_is_not_a_token_file(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)
    errors: list[Exception] = []

    def read() -> None:
        try:
            read_token(fifo)
        except Exception as e:
            errors.append(e)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(10.0)  # (read in a thread so that a reader blocked on the pipe fails the test)
    assert not reader.is_alive(), "blocked on the pipe waiting for a writer"
    assert "not a regular file" in str(errors[0])
    (tmp_path / "dir").mkdir(mode=0o700)
    with pytest.raises(ValueError):
        read_token(tmp_path / "dir")


def test_a_refused_reload_keeps_the_old_token_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path = _token_file(tmp_path / "token", "old-token-0123")
    creds = Credentials(None, admin="old-token-0123")
    files = TokenFiles(ServerConfig(token="old-token-0123", token_file=path), creds)
    theirs = _another_users(_token_file(tmp_path / "theirs", "their-token-0123"), monkeypatch)
    path.unlink()
    path.symlink_to(theirs)
    with caplog.at_level(logging.ERROR, logger="perseus.server"):
        assert files.reload("a token file changed") is False
    assert creds.admin == "old-token-0123"
    assert any(
        "not reloaded" in r.message
        and "owned by uid" in r.message
        and "old tokens stay" in r.message
        for r in caplog.records
    ), caplog.text
