"""The administration half of the service's door (``service/facade_admin.py``).

Tenants, the power budget and credentials through :class:`PerseusService`, on a real SQLite
store and no server. The same through REST is ``tests/server/rest/test_tenants.py`` and
``test_credentials.py``; the budget's allocation is ``test_power_budget.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from perseus_server.config import Limits
from perseus_server.domain.errors import BadRequest, Conflict, NotFound
from perseus_server.domain.jobs import JobSpec
from perseus_server.runtime.sql_store import SqlStore
from perseus_server.service import PerseusService
from perseus_server.service.credentials import Credentials, Scope

SPEC = JobSpec(stages=2, microbatches=4)


@pytest.fixture
def service(tmp_path: Path) -> Iterator[PerseusService]:
    store = SqlStore.open(tmp_path / "admin.db")
    try:
        service = PerseusService(store, Limits())
        service.load()
        yield service
    finally:
        store.close()


@pytest.fixture
def creds(service: PerseusService) -> Credentials:
    return service.authority("admin-token")


def test_a_tenant_holding_jobs_is_kept_until_they_go(service: PerseusService) -> None:
    service.create_tenant("team-a", {"max_jobs": 3})
    assert service.has_tenant("team-a") and not service.has_tenant("team-b")
    job_id = service.create_job(SPEC, tenant="team-a")["id"]
    assert service.tenant_of(job_id) == "team-a" and service.tenant_of("nope") is None
    assert [t["id"] for t in service.tenant_listing("team-a")] == ["team-a"]
    assert service.patch_tenant("team-a", {"max_jobs": 5})["max_jobs"] == 5
    with pytest.raises(Conflict, match="holds 1 job"):
        service.delete_tenant("team-a")
    with pytest.raises(Conflict, match="default tenant cannot be deleted"):
        service.delete_tenant("default")


def test_credentials_are_issued_listed_and_revoked_by_their_rules(
    service: PerseusService, creds: Credentials
) -> None:
    service.create_tenant("team-a", {})
    job_id = service.create_job(SPEC, tenant="team-a", credentials=creds)["id"]
    read = service.issue_credential(creds, Scope.READ, None)
    team = service.issue_credential(creds, Scope.TENANT_READ, "team-a")
    for scope, tenant, why in [
        (Scope.READ, "team-a", "reads every tenant"),
        (Scope.TENANT, None, "names its tenant"),
        (Scope.ZEUS, "team-z", "no tenant 'team-z'"),
    ]:
        with pytest.raises(BadRequest, match=why) as e:
            service.issue_credential(creds, scope, tenant)
        assert e.value.field == "tenant"
    mine = {c["id"] for c in service.credential_listing(creds, "team-a")}
    assert team["id"] in mine and read["id"] not in mine and len(mine) == 2  # and the job's
    assert len(service.credential_listing(creds, None)) == 3
    service.revoke_credential(creds, read["id"])
    with pytest.raises(NotFound, match="in force"):
        service.revoke_credential(creds, read["id"])
    rotated = service.rotate_rank_credential(creds, job_id)
    assert creds.identify(rotated["credential"]) is not None
    service.revoke_rank_credential(creds, job_id)
    with pytest.raises(NotFound, match="no rank credential in force"):
        service.revoke_rank_credential(creds, job_id)
    with pytest.raises(NotFound):
        service.rotate_rank_credential(creds, "nope")


def test_a_bad_power_budget_changes_nothing_and_none_set_is_a_404(
    service: PerseusService,
) -> None:
    with pytest.raises(NotFound):
        service.power_budget_view()
    with pytest.raises(NotFound, match="no power budget is set"):
        service.delete_power_budget()
    job_id = service.create_job(SPEC)["id"]
    with pytest.raises(BadRequest, match="has no frontier yet") as e:
        service.set_power_budget(900.0, "throughput", [job_id], "least_power")
    assert e.value.field == "jobs.0"
    with pytest.raises(BadRequest) as e:
        service.set_power_budget(-1.0, "throughput", None, "least_power")
    assert e.value.field == "watts"
    assert service.store.power_budget() is None
    view = service.set_power_budget(900.0, "throughput", None, "keep_current")
    assert view["watts"] == 900.0 and service.power_budget_view()["watts"] == 900.0
    service.delete_power_budget()
    assert service.store.power_budget() is None
