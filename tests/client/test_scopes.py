"""``perseus_client.scopes``: ``client.iteration()`` and ``client.instruction(...)``.

One reusable object of each per client (the hot path allocates nothing per instruction); an
instruction that raised is aborted, not recorded; misuse is a clear error.
"""

from __future__ import annotations

import pytest

from perseus_client import ClientError, ConfigError


def test_misuse_is_reported_clearly(client):
    with (
        pytest.raises(ClientError, match="inside a client.iteration"),
        client.instruction("forward", microbatch=0),
    ):
        pass
    with pytest.raises(ConfigError, match="kind: unknown instruction kind 'fwd'"):
        client.instruction("fwd", microbatch=0)
    with client.iteration(), pytest.raises(ClientError, match="do not nest"), client.iteration():
        pass


def test_each_scope_is_one_object_reused(client):
    assert client.iteration() is client.iteration()
    first = client.instruction("forward", microbatch=0)
    second = client.instruction("backward", microbatch=3, stage=1)
    assert first is second
    assert (second.kind, second.microbatch, second.stage) == ("backward", 3, 1)
    with client.iteration() as entered:
        assert entered is client


def test_an_instruction_that_raised_is_aborted_and_the_error_goes_on(client, rec, plan_of):
    client.use_plan(plan_of(1, [("forward", 0, 1200), ("forward", 1, 1000)]))
    with pytest.raises(RuntimeError, match="out of memory"), client.iteration():
        with client.instruction("forward", microbatch=0):
            pass
        with client.instruction("forward", microbatch=1):
            raise RuntimeError("out of memory")
    assert rec.inner.locked_clock is None  # unwinding: the GPU is unlocked
    with client.iteration():  # training goes on
        for mb in (0, 1):
            with client.instruction("forward", microbatch=mb):
                pass
    assert [(i.microbatch, i.frequency_mhz) for i in client.last_report.instructions] == [
        (0, 1200),
        (1, 1000),
    ]
