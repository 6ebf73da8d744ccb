"""The wire protocol evolves additively.

A client built from the first release's ``.proto`` (``fixtures/perseus_v1_41619ed.proto``,
``perseus.proto`` at commit 41619ed) registers, watches its plan and reports iterations against this
server.

The old stubs are compiled at test time and imported under their own module name
(``perseus_v1_41619ed_pb2``) in a separate interpreter: protobuf's default descriptor pool holds
one definition per message name, and this process already has today's ``perseus.v1``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest

from perseus_server import ServerProcess

from ..conftest import solved_job

FIXTURE = Path(__file__).parents[1] / "fixtures" / "perseus_v1_41619ed.proto"

CLIENT = textwrap.dedent(
    """
    import json, sys
    import grpc
    import perseus_v1_41619ed_pb2 as pb
    import perseus_v1_41619ed_pb2_grpc as pb_grpc

    target, job = sys.argv[1], sys.argv[2]
    stub = pb_grpc.PlanServiceStub(grpc.insecure_channel(target))
    reg = stub.RegisterRank(
        pb.RegisterRankRequest(
            job_id=job, global_rank=1, pipeline_rank=1, data_rank=0, gpu_name="NVIDIA A40",
            hostname="old-client",
        ),
        timeout=10,
    )
    stream = stub.WatchPlan(pb.WatchPlanRequest(job_id=job, rank_id=reg.rank_id), timeout=10)
    plan = next(stream)
    stream.cancel()
    reports = [
        pb.IterationReport(
            job_id=job, rank_id=reg.rank_id, iteration=i, iteration_time=0.5,
            plan_version=plan.version, energy=20.0,
            instructions=[
                pb.InstructionMeasurement(
                    instruction=s.instruction, microbatch=s.microbatch,
                    frequency_mhz=s.frequency_mhz, time=0.01, energy=1.0, stage=s.stage,
                )
                for s in plan.steps
            ],
        )
        for i in range(3)
    ]
    ack = stub.ReportIterations(iter(reports), timeout=10)
    print(json.dumps({
        "rank_id": reg.rank_id, "plan_version": reg.plan_version, "stages": reg.stages,
        "microbatches": reg.microbatches, "max_clock_mhz": reg.max_clock_mhz,
        "version": plan.version, "reason": plan.reason, "steps": len(plan.steps),
        "kinds": sorted({s.instruction for s in plan.steps}),
        "expected_iteration_time": plan.expected_iteration_time,
        "accepted": ack.accepted,
        "new_stubs_loaded": any(m.startswith("perseus_common") for m in sys.modules),
    }))
    """
)


@pytest.fixture(scope="module")
def old_stubs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from grpc_tools import protoc

    out = tmp_path_factory.mktemp("proto_41619ed")
    include = Path(protoc.__file__).parent / "_proto"
    rc = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{FIXTURE.parent}",
            f"-I{include}",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            FIXTURE.name,
        ]
    )
    assert rc == 0, "protoc failed on the 41619ed .proto"
    assert (out / "perseus_v1_41619ed_pb2.py").exists()
    (out / "client.py").write_text(CLIENT)
    return out


def test_a_client_of_the_first_release_runs_against_this_server(
    old_stubs: Path, server: ServerProcess, http: httpx.Client, small_csv: str
) -> None:
    job = solved_job(http, small_csv)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(old_stubs)  # the old stubs only: none of this repository
    proc = subprocess.run(
        [sys.executable, str(old_stubs / "client.py"), server.grpc_target, job],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert not got["new_stubs_loaded"]
    assert got["stages"] == 2 and got["microbatches"] == 4 and got["plan_version"] > 0
    assert got["version"] == got["plan_version"] and got["steps"] == 2 * 4
    assert got["kinds"] == ["backward", "forward"] and got["expected_iteration_time"] > 0
    assert got["reason"].startswith("default") and got["accepted"] == 3

    st = http.get(f"/jobs/{job}/status").json()
    (rank,) = st["ranks"]
    assert rank["rank_id"] == got["rank_id"] and rank["hostname"] == "old-client"
    assert rank["last_iteration"] == 2 and rank["last_plan_version"] == got["version"]
    assert st["pipelines"][0]["recent_iterations"][-1] == {"iteration": 2, "time": 0.5}
