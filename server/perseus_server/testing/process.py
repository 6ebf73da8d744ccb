"""Run ``perseus serve`` as a real subprocess (tests, benchmarks and ``perseus demo`` use it).

Example::

    with ServerProcess(tmp_path / "perseus.db", token="s3cret") as srv:
        httpx.get(srv.http_url + "/jobs", headers=srv.headers)
        channel = grpc.insecure_channel(srv.grpc_target)

Stable API:

* ``ServerProcess(db_path, *, token=None, host="127.0.0.1", http_port=0, grpc_port=0,
  tls_cert=None, tls_key=None, startup_timeout=60.0, log_path=None, env=None, extra_args=())``
  (``extra_args``: more ``perseus serve`` options, e.g. ``["--solve-time-limit", "60"]``)
* ``.start() -> ServerProcess`` (also ``__enter__``): launches ``python -m perseus_server``,
  waits until it printed its addresses and ``/healthz`` answers. Raises ``RuntimeError`` (with
  the server's output) if it exits or times out first.
* ``.stop(timeout=10.0) -> int``: SIGTERM, then SIGKILL after ``timeout``; returns the exit code
  (also ``__exit__``). ``.kill()``: SIGKILL now (crash tests). Both are no-ops when stopped.
* ``.http_url`` (``http://host:port`` or ``https://``), ``.grpc_target`` (``host:port``),
  ``.pid``, ``.token``, ``.headers`` (the ``Authorization`` header, or ``{}``),
  ``.grpc_metadata`` (``(("authorization", "Bearer ..."),)`` or ``()``), ``.db_path``,
  ``.returncode`` (None while running), ``.output()`` (everything the server printed).

Ports default to 0: the server picks free ones and prints them, so parallel runs never clash.
Restarting (``start()`` after ``stop()``/``kill()``) reuses the database and picks new ports.
"""

from __future__ import annotations

import os
import re
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

__all__ = ["ServerProcess"]

_REST = re.compile(r"perseus: REST listening on (\S+)")
_GRPC = re.compile(r"perseus: gRPC listening on (\S+)")


class ServerProcess:
    """A ``perseus serve`` subprocess on free ports (see the module docstring)."""

    def __init__(
        self,
        db_path: str | Path,
        *,
        token: str | None = None,
        host: str = "127.0.0.1",
        http_port: int = 0,
        grpc_port: int = 0,
        tls_cert: str | Path | None = None,
        tls_key: str | Path | None = None,
        startup_timeout: float = 60.0,
        log_path: str | Path | None = None,
        env: dict[str, str] | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        # A database URL (postgresql://...) stays a string: a Path would fold its "//".
        self.db_path: str | Path = db_path if "://" in str(db_path) else Path(db_path)
        self.token = token
        self.host = host
        self.http_port, self.grpc_port = http_port, grpc_port
        self.tls_cert = None if tls_cert is None else Path(tls_cert)
        self.tls_key = None if tls_key is None else Path(tls_key)
        self.startup_timeout = startup_timeout
        self.env = env
        self.extra_args = list(extra_args)
        self._tmp = tempfile.TemporaryDirectory(prefix="perseus-server-")
        self.log_path = (
            Path(log_path) if log_path is not None else Path(self._tmp.name) / "server.log"
        )
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_offset = 0
        self.http_url = ""
        self.grpc_target = ""

    # --- properties ------------------------------------------------------------------------------

    @property
    def pid(self) -> int:
        """The server process's id; raises ``RuntimeError`` before it is started."""
        if self._proc is None:
            raise RuntimeError("the server is not started")
        return self._proc.pid

    @property
    def returncode(self) -> int | None:
        """The server process's exit status; None while it runs or before it is started."""
        return None if self._proc is None else self._proc.poll()

    @property
    def headers(self) -> dict[str, str]:
        """The REST headers that carry the token (none without one)."""
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    @property
    def grpc_metadata(self) -> tuple[tuple[str, str], ...]:
        """The gRPC metadata that carries the token (none without one)."""
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()

    def output(self) -> str:
        """Everything the server printed (stdout and stderr) since it was first started."""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    # --- lifecycle -------------------------------------------------------------------------------

    def command(self) -> list[str]:
        """The command line that runs the server."""
        cmd = [
            sys.executable,
            "-m",
            "perseus_server",
            "--host",
            self.host,
            "--http-port",
            str(self.http_port),
            "--grpc-port",
            str(self.grpc_port),
            "--db",
            str(self.db_path),
        ]
        if self.token:
            token_file = Path(self._tmp.name) / "token"
            token_file.write_text(self.token + "\n")
            token_file.chmod(0o600)
            cmd += ["--token-file", str(token_file)]
        if self.tls_cert is not None and self.tls_key is not None:
            cmd += ["--tls-cert", str(self.tls_cert), "--tls-key", str(self.tls_key)]
        return cmd + self.extra_args

    def start(self) -> ServerProcess:
        """Start the server and wait until it is healthy; returns ``self``.

        Raises ``RuntimeError`` when it is already running, or when it exits while starting.
        """
        if self._proc is not None and self._proc.poll() is None:
            raise RuntimeError("the server is already running")
        env = dict(os.environ)
        env.update(self.env or {})
        env.setdefault("PYTHONUNBUFFERED", "1")
        with open(self.log_path, "ab") as log:
            self._log_offset = log.tell()
            self._proc = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        deadline = time.monotonic() + self.startup_timeout
        self.http_url = self.grpc_target = ""
        while time.monotonic() < deadline:
            text = self.output()[self._log_offset :] if self._log_offset else self.output()
            rest, grpc_ = _REST.search(text), _GRPC.search(text)
            if rest and grpc_:
                self.http_url, self.grpc_target = rest.group(1), grpc_.group(1)
                break
            if self._proc.poll() is not None:
                raise RuntimeError(
                    f"perseus serve exited with status {self._proc.returncode}:\n{self.output()}"
                )
            time.sleep(0.05)
        else:
            self.kill()
            raise RuntimeError(
                f"perseus serve did not start within {self.startup_timeout} s:\n{self.output()}"
            )
        self._wait_healthy(deadline)
        return self

    def _wait_healthy(self, deadline: float) -> None:
        import httpx

        verify: bool | ssl.SSLContext = (
            ssl.create_default_context(cafile=str(self.tls_cert))
            if self.tls_cert is not None
            else True
        )
        while time.monotonic() < deadline:
            try:
                if (
                    httpx.get(self.http_url + "/healthz", timeout=2.0, verify=verify).status_code
                    == 200
                ):
                    return
            except httpx.HTTPError:
                pass
            if self._proc is not None and self._proc.poll() is not None:
                raise RuntimeError(
                    f"perseus serve exited with status {self._proc.returncode}:\n{self.output()}"
                )
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"perseus serve never answered /healthz:\n{self.output()}")

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM, wait up to ``timeout`` s, then SIGKILL; returns the exit code."""
        if self._proc is None:
            return 0
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        return int(self._proc.returncode)

    def kill(self) -> None:
        """SIGKILL the server (and wait for it), as a crash would."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()

    def close(self) -> None:
        """Stop the server and remove its temporary directory."""
        self.stop()
        self._tmp.cleanup()

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
