"""``--advertise``: what a leader stores with its lease for a standby to name.

It is checked on entry (a bad value names the option and why, before anything starts) and read back
defensively.
"""

from __future__ import annotations

import pytest

from perseus_server.standby import advertise_problem, advertised, read_advertised


@pytest.mark.parametrize(
    "host", ["perseus-a", "perseus-a.svc.cluster.local", "10.0.0.7", "::1", "[fd00::7]"]
)
def test_host_names_and_addresses_are_accepted(host: str) -> None:
    assert advertise_problem(host) is None


@pytest.mark.parametrize(
    ("host", "why"),
    [
        ("perseus-a:50051", "without a port"),
        ("http://perseus-a", "without a scheme"),
        ("", "empty"),
        ("a b", "host name or an IP address"),
        ("a,b", "host name or an IP address"),
    ],
)
def test_a_bad_host_says_why(host: str, why: str) -> None:
    problem = advertise_problem(host)
    assert problem is not None and why in problem


def test_what_is_stored_reads_back_and_junk_reads_as_nothing() -> None:
    text = advertised("perseus-a:50051", "https://perseus-a:8000")
    assert read_advertised(text) == ("perseus-a:50051", "https://perseus-a:8000")
    for junk in ("", "not json", "[1, 2]", '{"grpc": null}'):
        assert read_advertised(junk) == ("", "")
