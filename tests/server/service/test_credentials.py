"""Scoped credentials (``service/credentials.py``) on a real SQLite store.

Who a secret identifies, issuing, rotating and revoking (with the generation an open stream
checks), and rank identities bound to their credential. The REST routes that issue them are
``tests/server/rest/test_credentials.py``; every route against every scope is
``test_authorization_matrix.py``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from perseus_server.domain.jobs import JobSpec
from perseus_server.domain.rows import TenantRow
from perseus_server.domain.store import Store
from perseus_server.runtime.sql_store import SqlStore
from perseus_server.service.credentials import (
    ADMIN,
    Credentials,
    Principal,
    Scope,
    bearer_secret,
    digest,
)


@pytest.fixture
def store() -> Iterator[Store]:
    s = SqlStore.open(":memory:")
    s.add_job("j", JobSpec(stages=2, microbatches=4))
    s.add_job("k", JobSpec(stages=2, microbatches=4))
    s.put_tenant(TenantRow("team-a", 0.0))
    yield s
    s.close()


def test_an_open_server_answers_admin_for_anything() -> None:
    creds = Credentials(None, admin=None)
    assert not creds.enabled
    assert creds.identify(None) is ADMIN and creds.identify("whatever") is ADMIN
    assert creds.from_metadata(None) is ADMIN
    with pytest.raises(ValueError, match="a read token needs an admin token"):
        Credentials(None, admin=None, read=("r",))


def test_configured_tokens_and_headers_identify_their_scopes() -> None:
    creds = Credentials(None, admin="adm", read=("rd1", "rd2"))
    assert creds.identify("adm") is ADMIN
    assert creds.identify("rd2") == Principal(Scope.READ)
    assert creds.identify("nope") is None and creds.identify(None) is None
    assert creds.from_header("Bearer  adm ") is ADMIN
    assert creds.from_header("Basic adm") is None
    md = [("x-other", "adm"), ("Authorization", "Bearer wrong"), ("authorization", "Bearer rd1")]
    assert creds.from_metadata(md) == Principal(Scope.READ)
    assert bearer_secret("bearer t") == "t" and bearer_secret("Bearer ") is None
    assert digest("s") == digest("s") != digest("t") and len(digest("s")) == 64


def test_an_issued_secret_is_stored_only_as_its_digest(store: Store) -> None:
    creds = Credentials(store, admin="adm")
    issued = creds.issue(Scope.TENANT, tenant="team-a")
    assert issued.secret.startswith("perseus-tenant-")
    (row,) = store.credentials()
    assert row.hash == digest(issued.secret) and all(
        issued.secret != getattr(row, k) for k in type(row).__slots__
    )
    who = creds.identify(issued.secret)
    assert who == Principal(Scope.TENANT, issued.id, None, 0, "team-a")
    assert issued.to_json()["credential"] == issued.secret
    assert "credential" not in creds.listing()[0]


@pytest.mark.parametrize(
    ("scope", "job", "tenant", "why"),
    [
        (Scope.RANK, None, None, "names its job"),
        (Scope.READ, "j", None, "names its job"),
        (Scope.ZEUS, None, None, "names its tenant"),
        (Scope.READ, None, "team-a", "names its tenant"),
        (Scope.ADMIN, None, None, "never issued"),
    ],
)
def test_an_ill_formed_issue_is_refused(
    store: Store, scope: Scope, job: str | None, tenant: str | None, why: str
) -> None:
    with pytest.raises(ValueError, match=why):
        Credentials(store, admin="adm").issue(scope, job, tenant)


def test_rotation_and_revocation_end_the_old_secret_and_open_streams(store: Store) -> None:
    creds = Credentials(store, admin="adm")
    first = creds.rotate_rank("j")  # none yet: issued
    who = creds.identify(first.secret)
    assert who is not None and who.job_id == "j" and creds.current(who)
    second = creds.rotate_rank("j")
    assert second.id == first.id  # the same credential, a new secret
    assert creds.identify(first.secret) is None and not creds.current(who)
    again = creds.identify(second.secret)
    assert again is not None and again.generation == 1 and creds.current(again)
    assert creds.revoke_rank("j") and not creds.revoke_rank("j")
    assert creds.identify(second.secret) is None and not creds.current(again)
    assert not creds.revoke("cred-unknown") and not creds.revoke_rank("k")
    assert creds.current(ADMIN)


def test_a_rank_identity_is_bound_to_the_credential_that_registered_it(store: Store) -> None:
    creds = Credentials(store, admin="adm")
    j1 = creds.identify(creds.issue(Scope.RANK, "j").secret)
    j2 = creds.identify(creds.issue(Scope.RANK, "j").secret)
    k = creds.identify(creds.issue(Scope.RANK, "k").secret)
    assert j1 is not None and j2 is not None and k is not None
    assert creds.register_refusal(j1, "j", 0) is None
    assert creds.bind(j1, "j-0", "j", 0) is None
    assert creds.rank_refusal(j1, "j", "j-0") is None
    refused = creds.register_refusal(j2, "j", 0)
    assert refused is not None and refused.startswith("global_rank: rank 0 of job j")
    assert creds.bind(j2, "j-0b", "j", 0) is not None  # the first credential keeps the slot
    assert (creds.rank_refusal(j2, "j", "j-0") or "").startswith("rank_id: rank 'j-0'")
    assert (creds.register_refusal(k, "j", 1) or "").startswith("job_id: ")
    assert creds.register_refusal(Principal(Scope.READ), "j", 1) == (
        "a read credential cannot register ranks"
    )
    assert creds.register_refusal(ADMIN, "j", 0) is None  # the admin may act as any rank
    assert creds.rank_refusal(ADMIN, "j", "j-0") is None


def test_a_tenants_listing_shows_its_own_and_its_jobs_rank_credentials(store: Store) -> None:
    creds = Credentials(store, admin="adm")
    mine = creds.issue(Scope.TENANT_READ, tenant="team-a")
    job = creds.issue(Scope.RANK, "j")
    creds.issue(Scope.RANK, "k")
    creds.issue(Scope.READ)
    listed = creds.tenant_listing("team-a", lambda job_id: job_id == "j")
    assert sorted(c["id"] for c in listed) == sorted([mine.id, job.id])
    assert len(creds.listing()) == 4
