"""Integrations keep stdout clean.

Exporting orders and printing them as JSON gives JSON on stdout alone, even when the framework warns
at import (DeepSpeed logs "Setting accelerator to CPU" to stdout on a machine without a GPU); what
the framework says goes to stderr.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

EXPORTERS = {
    "deepspeed": "from perseus_client.integrations import deepspeed as m\n"
    "orders = m.export_orders(4, 2)",
    "megatron": "from perseus_client.integrations import megatron as m\n"
    "orders = m.export_orders(4, 2)",
    "torch_pipelining": "from perseus_client.integrations import torch_pipelining as m\n"
    "orders = m.orders_for('Interleaved1F1B', 2, 4)",
}

FRAMEWORK = {"deepspeed": "deepspeed", "megatron": "megatron.core", "torch_pipelining": "torch"}


def run(code: str) -> subprocess.CompletedProcess[str]:
    # DeepSpeed warns (on stdout, unpatched) when it picks its accelerator itself: not when
    # another test of this process set DS_ACCELERATOR, so the child never inherits it.
    env = {k: v for k, v in os.environ.items() if k != "DS_ACCELERATOR"}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


@pytest.mark.parametrize("name", sorted(EXPORTERS))
def test_exported_orders_on_stdout_are_json(name: str) -> None:
    pytest.importorskip(FRAMEWORK[name])
    proc = run(EXPORTERS[name] + "\nimport json\nprint(json.dumps(orders))\n")
    assert proc.returncode == 0, proc.stderr
    orders = json.loads(proc.stdout)  # stdout holds the JSON document and nothing else
    assert len(orders) == 2 and all(orders)


def test_deepspeed_warnings_go_to_stderr_not_away() -> None:
    pytest.importorskip("deepspeed")
    proc = run(EXPORTERS["deepspeed"] + "\nimport json\nprint(json.dumps(orders))\n")
    assert proc.returncode == 0, proc.stderr
    assert "Setting accelerator to CPU" in proc.stderr
    assert "Setting accelerator" not in proc.stdout


def test_a_stdout_log_handler_set_up_before_is_kept_out_while_exporting() -> None:
    pytest.importorskip("deepspeed")
    code = """
    import logging, sys, json
    logging.basicConfig(stream=sys.stdout, level=logging.INFO)  # the user's own choice
    logging.getLogger("DeepSpeed")  # created before the import
    from perseus_client.integrations import deepspeed as m
    from perseus_client.integrations._base import stdout_to_stderr
    with stdout_to_stderr():
        logging.getLogger("framework").warning("framework noise")
        print("print noise")
    orders = m.export_orders(2, 2)
    logging.getLogger("user").info("after export")  # the user's handler is theirs again
    """
    proc = run(code)
    assert proc.returncode == 0, proc.stderr
    assert "framework noise" in proc.stderr and "print noise" in proc.stderr
    assert "noise" not in proc.stdout and "after export" in proc.stdout
