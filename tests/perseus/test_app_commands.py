"""The applications' subcommands discovered by the core (``perseus.app_commands``).

Every application's entry point found in the installed metadata, its ``Subcommand`` loaded only
when asked, and one that is missing or names something else reported, not raised, by
``describe``. The ``perseus`` command's use of them, in real subprocesses, is
``test_cli_subcommands.py``.
"""

from __future__ import annotations

from importlib.metadata import EntryPoint

import pytest
from test_cli_subcommands import HELP

from perseus.app_commands import app_commands, describe, load
from perseus_common.commands import GROUP, Subcommand


def test_every_application_registers_its_subcommands() -> None:
    found = app_commands()
    assert set(found) == set(HELP), sorted(found)
    packages = {"serve": "perseus_server", "db": "perseus_server", "demo": "perseus_demo"}
    packages["gpud"] = "perseus_gpud"
    for name, entry in found.items():
        assert entry.group == GROUP
        assert entry.module.split(".")[0] == packages[name], entry.value
        command = entry.load()
        assert isinstance(command, Subcommand) and command.help == HELP[name]


def test_describe_names_what_is_wrong_with_an_entry_point() -> None:
    missing = EntryPoint(name="x", value="perseus_no_such_module:X", group=GROUP)
    assert describe(missing).startswith("(cannot be loaded: ModuleNotFoundError")


def test_load_refuses_an_entry_point_that_names_no_subcommand() -> None:
    wrong = EntryPoint(name="x", value="perseus_common.commands:GROUP", group=GROUP)
    with pytest.raises(TypeError, match="entry point 'x' .*is not a Subcommand"):
        load(wrong)
    assert describe(wrong) == (
        f"(cannot be loaded: TypeError: the {GROUP} entry point 'x' "
        "(perseus_common.commands:GROUP) is not a Subcommand)"
    )


def test_load_gives_the_subcommand_an_entry_point_names() -> None:
    entry = app_commands()["serve"]
    assert load(entry) is entry.load()
    assert describe(entry) == HELP["serve"]
