"""A throwaway PostgreSQL server for tests and benchmarks.

``initdb`` and ``pg_ctl`` (Debian's ``postgresql`` package) in a temporary directory, listening on a
Unix socket there only.

Example::

    with PostgresServer() as pg:
        url = pg.create_database("t1")      # postgresql://perseus@/t1?host=...&port=...
        store = SqlStore.open(url)

PostgreSQL refuses to run as root; run as root (as CI does), the server runs as the
unprivileged user ``nobody`` in a directory given to it. ``durable=False`` (tests) turns off
``fsync`` and synchronous commits: fast, and safe as long as the machine does not crash;
benchmarks keep PostgreSQL's defaults. :func:`postgres_binaries` finds the binaries (None when
PostgreSQL is not installed: callers skip, saying so).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = ["PostgresServer", "postgres_binaries"]

#: The database superuser the throwaway server is created with (trust authentication, socket only).
USER = "perseus"


def postgres_binaries() -> Path | None:
    """The directory holding ``initdb`` and ``pg_ctl``, or None.

    PATH first, then Debian's ``/usr/lib/postgresql/<version>/bin``, newest first.
    """
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(found).parent
    root = Path("/usr/lib/postgresql")
    if root.is_dir():
        versions = sorted(
            (p for p in root.iterdir() if p.name.isdigit()), key=lambda p: int(p.name)
        )
        for v in reversed(versions):
            if (v / "bin" / "initdb").is_file() and (v / "bin" / "pg_ctl").is_file():
                return v / "bin"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    """One PostgreSQL server in a temporary directory (see the module docstring)."""

    def __init__(self, *, durable: bool = False, bin_dir: Path | None = None) -> None:
        found = bin_dir or postgres_binaries()
        if found is None:
            raise RuntimeError("PostgreSQL is not installed (initdb and pg_ctl not found)")
        self.bin = found
        self.durable = durable
        self.port = _free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="perseus-pg-"))
        self.data = self.dir / "data"
        self._user: dict[str, Any] = {}
        if os.geteuid() == 0:
            nobody = pwd.getpwnam("nobody")
            os.chown(self.dir, nobody.pw_uid, nobody.pw_gid)
            self._user = {"user": nobody.pw_uid, "group": nobody.pw_gid, "extra_groups": []}
        self.started = False

    def _run(self, *args: str) -> None:
        out = subprocess.run(
            [str(self.bin / args[0]), *args[1:]],
            cwd=self.dir,
            capture_output=True,
            text=True,
            env={**os.environ, "LC_ALL": "C", "TZ": "UTC"},
            **self._user,
        )
        if out.returncode != 0:
            raise RuntimeError(f"{args[0]} failed ({out.returncode}): {out.stdout}{out.stderr}")

    def start(self) -> PostgresServer:
        """Create the database cluster and start the server; returns ``self``."""
        self._run(
            "initdb", "-D", str(self.data), "-U", USER, "--auth=trust", "-E", "UTF8", "--no-sync"
        )
        options = [
            f"-p {self.port}",
            "-c listen_addresses=''",
            f"-c unix_socket_directories={self.dir}",
            "-c max_connections=200",
        ]
        if not self.durable:
            options += ["-c fsync=off", "-c synchronous_commit=off", "-c full_page_writes=off"]
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.dir / "log"), "-w", "-t", "60",
            "-o", " ".join(options), "start",
        )  # fmt: skip
        self.started = True
        return self

    def url(self, database: str = "postgres") -> str:
        """The URL of one of its databases (over its Unix socket)."""
        return f"postgresql://{USER}@/{database}?host={self.dir}&port={self.port}"

    def create_database(self, name: str, template: str = "template0") -> str:
        """Create database ``name`` (a copy of ``template``); returns its URL."""
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
        return self.url(name)

    def log(self) -> str:
        """The server's log so far (empty when it cannot be read)."""
        try:
            return (self.dir / "log").read_text(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        """Stop the server, if it was started."""
        if self.started:
            self.started = False
            with contextlib.suppress(RuntimeError):
                self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
