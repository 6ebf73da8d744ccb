"""``domain/states.py``: the server's states, kinds and sources, each a string-valued enum.

A member is its string (what the store holds and the API returns), read back from it as itself;
a solve is active while queued, running or partial.
"""

from __future__ import annotations

import json

from perseus_server.domain.states import DeploymentKind, JobState, SolveStatus, StragglerSource


def test_a_stored_string_reads_back_as_its_member() -> None:
    for state in JobState:
        assert JobState(str(state)) is state
    assert SolveStatus("partial") is SolveStatus.PARTIAL


def test_a_solve_is_active_until_it_is_done_or_failed() -> None:
    active = {s for s in SolveStatus if s.active}
    assert active == {SolveStatus.QUEUED, SolveStatus.RUNNING, SolveStatus.PARTIAL}


def test_states_are_their_strings() -> None:
    assert StragglerSource.SLOW_STAGE == "slow stage"
    assert json.dumps({"kind": DeploymentKind.MAX_CLOCK, "state": JobState.READY}) == (
        '{"kind": "max_clock", "state": "ready"}'
    )
    assert f"{StragglerSource.REPORTED}" == "reported"
