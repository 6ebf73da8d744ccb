"""``cli.py``: the ``perseus serve`` command line (also ``python -m perseus_server``).

Every option is checked on entry: a bad value exits with status 2 naming the option and the
problem, before anything listens or opens the store.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from perseus_server.cli import is_loopback, main

TOKEN = "t0k-" + "x" * 28


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """``main(argv)``'s exit status checked to be 2; returns what it printed on stderr."""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost"])
def test_loopback_hosts_are_loopback(host: str) -> None:
    assert is_loopback(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "10.0.0.7", "::", "no-such-host.invalid"])
def test_other_hosts_and_unresolvable_names_are_not_loopback(host: str) -> None:
    assert not is_loopback(host)


def test_a_host_beyond_loopback_needs_a_token_or_insecure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _refused(["--db", str(tmp_path / "p.db"), "--host", "0.0.0.0"], capsys)
    assert "--host 0.0.0.0 is not a loopback address" in err and "--insecure" in err
    assert not (tmp_path / "p.db").exists()  # refused before the store is opened


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--http-port", "70000"], "--http-port must be between 0 and 65535"),
        (["--leader-lease", "0"], "--leader-lease must be between 0 and 3600"),
        (["--max-streams-per-credential", "0"], "--max-streams-per-credential must be positive"),
        (["--tls-cert", "/nonexistent.pem"], "--tls-cert and --tls-key go together"),
        (["--profile-mismatch-band", "2,0.5"], "--profile-mismatch-band needs 0 < LOW < 1 < HIGH"),
        (["--profile-mismatch-band", "x"], "--profile-mismatch-band must be two numbers"),
        (["--max-jobs", "0"], "--max-jobs, --max-gpus"),
        (["--tenant-write-rate", "inf"], "--tenant-write-rate must be a number >= 0"),
    ],
)
def test_a_bad_option_exits_2_naming_it(
    argv: list[str], says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert says in _refused(["--db", str(tmp_path / "p.db"), *argv], capsys)


def test_the_read_token_needs_its_own_admin_token(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    db = ["--db", str(tmp_path / "p.db")]
    err = _refused([*db, "--read-token-file", str(token)], capsys)
    assert "--read-token-file needs --token-file" in err
    err = _refused([*db, "--token-file", str(token), "--read-token-file", str(token)], capsys)
    assert "--read-token-file must hold another token than --token-file" in err


def test_token_file_must_be_usable(tmp_path: Path) -> None:
    # Through ``python -m perseus_server`` (__main__.py), as ServerProcess runs it.
    empty = tmp_path / "token"
    empty.write_text("  \n")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "perseus_server",
            "--http-port",
            "0",
            "--grpc-port",
            "0",
            "--db",
            str(tmp_path / "x.db"),
            "--token-file",
            str(empty),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "--token-file" in r.stderr


def test_the_command_line_refuses_a_bad_advertise(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--db", "postgresql://perseus@db/perseus", "--advertise", "perseus-a:50051"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--advertise 'perseus-a:50051'" in err and "without a port" in err


def test_serve_refuses_an_unknown_kind_of_database(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--db", "mysql://perseus@db/perseus"])
    assert exit_.value.code == 2
    assert "--db mysql://...: unknown kind of database 'mysql'" in capsys.readouterr().err


def test_the_zeus_options_need_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, says in (
        (["--zeus-plan-wait", "5"], "need --zeus"),
        (["--zeus-default-prototype", "p"], "need --zeus"),
        (["--zeus", "--zeus-plan-wait", "0"], "--zeus-plan-wait must be"),
    ):
        with pytest.raises(SystemExit) as exit:
            main(argv)
        assert exit.value.code == 2 and says in capsys.readouterr().err
