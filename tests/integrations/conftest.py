"""Fixtures of the integration tests: one real ``perseus serve`` shared by the whole directory, and
a launcher that runs rank worker scripts as real processes over gloo."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from integration_harness import free_port, rank_environment

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def perseus_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from perseus_server.process import ServerProcess

    db = tmp_path_factory.mktemp("integrations-server") / "perseus.db"
    server = ServerProcess(db)
    server.start()
    try:
        yield server
    finally:
        server.close()


def run_ranks(
    script: str, world: int, config: dict[str, Any], out: Path, timeout: float = 240.0
) -> None:
    """Run ``world`` copies of ``script`` (one per rank) to completion; fail with their output."""
    out.mkdir(parents=True, exist_ok=True)
    cfg = out / "config.json"
    cfg.write_text(json.dumps(config))
    env = rank_environment(free_port())
    logs = [out / f"rank{r}.log" for r in range(world)]
    procs = []
    for r in range(world):
        with open(logs[r], "wb") as log:
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        str(HERE / script),
                        "--rank",
                        str(r),
                        "--world",
                        str(world),
                        "--config",
                        str(cfg),
                        "--out",
                        str(out),
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=str(HERE),
                )
            )
    codes = []
    try:
        for p in procs:
            codes.append(p.wait(timeout=timeout))
    except subprocess.TimeoutExpired:
        pass
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    if codes != [0] * world:
        tails = "\n".join(
            f"--- rank {r} (exit {procs[r].returncode}) ---\n"
            + logs[r].read_text(errors="replace")[-4000:]
            for r in range(world)
        )
        pytest.fail(f"{script} ranks failed:\n{tails}")
