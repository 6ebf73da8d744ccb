"""Parsing off the event loop, in a worker process (``runtime/parse_pool.py``)."""

from __future__ import annotations

import asyncio
from typing import Any

from perseus.schedules import one_f_one_b
from perseus_common.proto import perseus_pb2 as pb
from perseus_common.wire.codec import decode_report
from perseus_common.wire.values import IterationReport
from perseus_server.domain.instruction_columns import InstructionColumns
from perseus_server.grpc.report_decoder import decode_report_bytes
from perseus_server.runtime.parse_pool import ParsePool, ReportPool, parse_profile_doc

from ..conftest import BLOCKING_A40
from ..grpc.test_report_decoder import old_decode_report


def test_report_pool_decodes_in_a_process_and_falls_back() -> None:
    msg = pb.IterationReport(
        job_id="j",
        instructions=[
            pb.InstructionMeasurement(instruction="forward", microbatch=i, time=0.1, stage=0)
            for i in range(1000)
        ],
    )
    pool = ReportPool(decode_report_bytes)

    async def main() -> tuple[IterationReport, IterationReport]:
        ok = await pool.decode(msg.SerializeToString, lambda: decode_report(msg))
        # Bytes the worker cannot parse make it fail: the fallback's value is used.
        fallback = await pool.decode(lambda: b"\xff\xff\xff", lambda: decode_report(msg))
        return ok, fallback

    try:
        ok, fallback = asyncio.run(main())
    finally:
        pool.close()
    assert isinstance(ok.instructions, InstructionColumns)
    assert ok == old_decode_report(msg)
    assert isinstance(fallback.instructions, tuple) and fallback == ok


def _parse(pool: ParsePool, text: str, stages: int = 2) -> tuple[Any, ...]:
    schedule = one_f_one_b(stages, 4).to_json()

    async def main() -> tuple[Any, ...]:
        return await pool.parse(text, False, schedule, BLOCKING_A40)

    return asyncio.run(main())


def test_a_profile_parses_on_a_thread_or_in_the_worker_alike(small_csv: str) -> None:
    direct = parse_profile_doc(small_csv, False, one_f_one_b(2, 4).to_json(), BLOCKING_A40)
    assert direct[0] == "ok" and direct[1].stages == 2
    for threshold in (len(small_csv), 10):  # at the threshold: a thread; above it: the worker
        pool = ParsePool(threshold=threshold)
        try:
            status, profile, csv_text = _parse(pool, small_csv)
            assert (pool._pool is not None) == (threshold == 10)
        finally:
            pool.close()
        assert status == "ok" and profile.to_csv() == csv_text == direct[2]
        assert pool._pool is None


def test_a_profile_that_does_not_fit_the_schedule_is_an_error_naming_why(small_csv: str) -> None:
    pool = ParsePool(threshold=10)
    try:
        status, detail, _field, _row = _parse(pool, small_csv, stages=4)  # a 2-stage profile
        assert status == "error" and "stage" in detail
        bad = _parse(pool, "stage,instruction,frequency,time,energy\n0,forward,x,1,1\n")
        assert bad[0] == "error" and bad[2] is not None and bad[3] is not None
    finally:
        pool.close()
