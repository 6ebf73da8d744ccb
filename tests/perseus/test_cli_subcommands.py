"""The applications' subcommands of ``perseus``: registered as entry points, discovered by the core.

Run as real subprocesses: ``perseus --help`` lists every subcommand with its line, each app's
subcommand runs its own command line, and an application installed beside Perseus (a real
distribution's metadata on the path) adds a subcommand without the core naming it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from perseus_common.commands import GROUP

PERSEUS = [sys.executable, "-m", "perseus"]
#: Each application's subcommands and the line ``perseus --help`` gives them (as before they
#: were registered: the same words).
HELP = {
    "serve": "run the server (see `perseus serve --help`)",
    "db": "the server's store: `perseus db migrate SRC DST` copies it",
    "demo": "the whole system on this machine (see `perseus demo --help`)",
    "gpud": "the node daemon: clock control for unprivileged trainers (see `perseus gpud --help`)",
}


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*PERSEUS, *args], capture_output=True, text=True, timeout=300, env=env)


def test_help_lists_every_subcommand_with_its_line() -> None:
    out = run("--help")
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())  # argparse wraps the lines
    assert "{frontier,plot,db,demo,gpud,serve}" in text
    for line in ["compute the time-energy frontier of a profile", *HELP.values()]:
        assert " ".join(line.split()) in text, line


@pytest.mark.parametrize(
    ("name", "usage"),
    [
        ("serve", "usage: perseus serve"),
        ("db", "usage: perseus db"),
        ("demo", "usage: perseus demo"),
        ("gpud", "usage: perseus gpud"),
    ],
)
def test_each_subcommand_runs_its_own_command_line(name: str, usage: str) -> None:
    out = run(name, "--help")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(usage), out.stdout[:200]


def test_a_subcommand_passes_its_arguments_and_exit_status_through(tmp_path: Path) -> None:
    out = run("gpud", "status", "--socket", str(tmp_path / "none.sock"))
    assert out.returncode == 1  # gpud status: 1 when the daemon cannot be reached
    assert "cannot reach the Perseus node daemon" in out.stderr
    bad = run("db", "migrate")
    assert bad.returncode == 2 and "usage: perseus db migrate" in bad.stderr


def _fake_application(site: Path, module: str, body: str) -> None:
    """A distribution ``fakeapp`` installed in ``site``, registering subcommand ``hello``."""
    (site / f"{module}.py").write_text(textwrap.dedent(body))
    info = site / "fakeapp-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fakeapp\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{GROUP}]\nhello = {module}:HELLO\n")


def _env_with(site: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(site), *sys.path])
    return env


def test_an_installed_application_adds_a_subcommand(tmp_path: Path) -> None:
    _fake_application(
        tmp_path,
        "fakeapp",
        """
        import sys
        from perseus_common.commands import Subcommand

        def _hello(argv):
            print("hello", *argv)
            return 7

        HELLO = Subcommand(help="say hello from an application", run=_hello)
        """,
    )
    env = _env_with(tmp_path)
    out = run("hello", "a", "--b", env=env)
    assert (out.returncode, out.stdout) == (7, "hello a --b\n"), out.stderr
    listed = run("--help", env=env)
    assert "say hello from an application" in listed.stdout


def test_a_broken_application_does_not_break_help(tmp_path: Path) -> None:
    _fake_application(tmp_path, "brokenapp", "HELLO = 'not a Subcommand'\n")
    env = _env_with(tmp_path)
    listed = run("--help", env=env)
    assert listed.returncode == 0, listed.stderr
    assert "hello" in listed.stdout and "cannot be loaded: TypeError" in listed.stdout
    ran = run("hello", env=env)
    assert ran.returncode != 0 and "is not a Subcommand" in ran.stderr
    frontier = run("plot", "--help", env=env)  # the core's own commands load no application
    assert frontier.returncode == 0, frontier.stderr


def test_without_installed_metadata_help_says_to_install(tmp_path: Path) -> None:
    """A source tree on the path but never installed: the core runs, and says what is missing."""
    root = Path(__file__).resolve().parents[2]
    # The packages alone, linked into a folder of their own: the checkout's root also holds the
    # metadata an editable install writes there (perseus.egg-info), which would be found.
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "perseus").symlink_to(root / "perseus")
    (tree / "perseus_common").symlink_to(root / "common" / "perseus_common")
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(tree)}
    probe = (
        "import sys; sys.path[:] = [p for p in sys.path if 'site-packages' not in p]; "
        "from perseus.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    out = subprocess.run(
        [sys.executable, "-S", "-c", probe, "--help"],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "{frontier,plot}" in out.stdout
    assert "install Perseus (pip install -e . from a checkout)" in " ".join(out.stdout.split())
