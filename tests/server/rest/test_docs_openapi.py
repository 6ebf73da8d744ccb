"""The published OpenAPI document.

Every operation documented, response models closed, and the checker that validates real responses
against it (used by ``test_openapi_lifecycle``).

:class:`Contract` sends a request, finds the documented response of that path, method and
status, and validates the body against its JSON schema (``$ref`` resolved into the document's
components). Response models forbid unknown keys, so a key the schema lacks fails the check;
the REST layer validates the service's dicts against the same models, so such a key is a
server error before it is a silent change of the wire format.
"""

from __future__ import annotations

from typing import Any

import httpx
import jsonschema_rs
import pytest
from fastapi.exceptions import ResponseValidationError
from fastapi.testclient import TestClient

from perseus_server import ServerProcess
from perseus_server.config import Limits
from perseus_server.domain.jobs import JobSpec
from perseus_server.rest import create_app
from perseus_server.runtime.sql_store import SqlStore
from perseus_server.service import PerseusService

from ..conftest import make_job

JSON_TYPES = ("application/json", "application/problem+json")


def media_type(value: str) -> tuple[str, frozenset[str]]:
    """``text/plain; version=0.0.4`` -> (``text/plain``, {``version=0.0.4``})."""
    base, *params = (p.strip().lower() for p in value.split(";"))
    return base, frozenset(p.replace(" ", "") for p in params if p)


def validator(doc: dict[str, Any], schema: dict[str, Any]) -> Any:
    """A JSON Schema 2020-12 validator of ``schema`` whose refs resolve into ``doc``."""
    root = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        **schema,
        "components": doc.get("components", {}),
    }
    return jsonschema_rs.validator_for(root)


class Contract:
    """Requests through ``http``, each response checked against ``doc`` (the OpenAPI document)."""

    def __init__(self, http: httpx.Client, doc: dict[str, Any] | None = None) -> None:
        self.http = http
        self.doc = doc if doc is not None else http.get("/openapi.json").json()
        self.seen: set[tuple[str, str, int, str]] = set()
        self._validators: dict[tuple[str, str, str, str], Any] = {}

    def call(
        self,
        method: str,
        template: str,
        status: int,
        *,
        path: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> httpx.Response:
        """Send ``method template`` and check the answer; returns the response.

        ``path`` fills its parameters; asserts ``status`` and checks the body against the
        documented response.
        """
        r = self.http.request(method, template.format(**(path or {})), **kwargs)
        assert r.status_code == status, f"{method} {template}: {r.status_code} {r.text[:500]}"
        self.check(method, template, r)
        return r

    def check(self, method: str, template: str, r: httpx.Response) -> None:
        """Check one response of ``method template`` against its documented schema."""
        op = self.doc["paths"][template][method.lower()]
        documented = op["responses"].get(str(r.status_code))
        assert documented is not None, (
            f"{method} {template}: status {r.status_code} is not documented ({r.text[:300]})"
        )
        content = documented.get("content", {})
        if r.status_code == 204:
            assert not content and not r.content
            self.seen.add((method.upper(), template, 204, ""))
            return
        got_base, got_params = media_type(r.headers.get("content-type", ""))
        matches = [
            key
            for key in content
            if media_type(key)[0] == got_base and media_type(key)[1] <= got_params
        ]
        assert matches, (
            f"{method} {template} {r.status_code}: {r.headers.get('content-type')!r} is not "
            f"among the documented media types {sorted(content)}"
        )
        key = matches[0]
        self.seen.add((method.upper(), template, r.status_code, key))
        if got_base not in JSON_TYPES:
            return
        schema = content[key].get("schema")
        assert schema, f"{method} {template} {r.status_code} {key}: no schema"
        vkey = (method.upper(), template, str(r.status_code), key)
        if vkey not in self._validators:
            self._validators[vkey] = validator(self.doc, schema)
        errors = [str(e).splitlines()[0] for e in self._validators[vkey].iter_errors(r.json())]
        assert not errors, f"{method} {template} {r.status_code}: {errors[:5]}\n{r.text[:1000]}"

    def documented_successes(self) -> set[tuple[str, str, int, str]]:
        """Every (method, path, 2xx status, media type) the document declares."""
        out = set()
        for template, ops in self.doc["paths"].items():
            for method, op in ops.items():
                for code, resp in op["responses"].items():
                    if code.startswith("2"):
                        for key in resp.get("content") or {"": None}:
                            out.add((method.upper(), template, int(code), key))
        return out


# --- the document --------------------------------------------------------------------------------


def _object_schemas(node: Any) -> list[dict[str, Any]]:
    """Every object schema with properties inside ``node``."""
    out: list[dict[str, Any]] = []
    if isinstance(node, dict):
        if "properties" in node:
            out.append(node)
        for v in node.values():
            out += _object_schemas(v)
    elif isinstance(node, list):
        for v in node:
            out += _object_schemas(v)
    return out


def _refs(node: Any) -> set[str]:
    if isinstance(node, dict):
        here = {str(node["$ref"]).rsplit("/", 1)[-1]} if "$ref" in node else set()
        return here.union(*(_refs(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(_refs(v) for v in node))
    return set()


def _closure(doc: dict[str, Any], names: set[str]) -> set[str]:
    comps = doc["components"]["schemas"]
    todo, done = set(names), set()
    while todo:
        n = todo.pop()
        done.add(n)
        todo |= _refs(comps[n]) - done
    return done


def test_every_operation_documents_its_responses(http: httpx.Client) -> None:
    doc = http.get("/openapi.json").json()
    ops = [(m.upper(), p, op) for p, item in doc["paths"].items() for m, op in item.items()]
    assert len(ops) >= 21
    response_models: set[str] = set()
    for method, path, op in ops:
        where = f"{method} {path}"
        assert op.get("summary") and op.get("description"), f"{where}: no summary/description"
        ok = {c: r for c, r in op["responses"].items() if c.startswith("2")}
        assert len(ok) == 1, f"{where}: {sorted(op['responses'])}"
        ((code, resp),) = ok.items()
        assert resp.get("description"), where
        if code == "204":
            assert not resp.get("content"), where
        else:
            assert resp.get("content"), f"{where}: {code} has no content"
            for media, body in resp["content"].items():
                assert body.get("schema"), f"{where}: {code} {media} has no schema"
                if media == "application/json":
                    response_models |= _refs(body["schema"])
        errors = {c: r for c, r in op["responses"].items() if not c.startswith("2")}
        assert ("401" in errors) == (path != "/healthz"), where
        for c, r in errors.items():
            assert c.startswith("4") and r.get("description"), f"{where}: {c}"
            assert list(r["content"]) == ["application/problem+json"], f"{where}: {c}"
            assert r["content"]["application/problem+json"]["schema"] == {
                "$ref": "#/components/schemas/Problem"
            }
    assert "HTTPValidationError" not in doc["components"]["schemas"]
    media = {
        (m, p): set(op["responses"][c]["content"])
        for m, p, op in ops
        for c in op["responses"]
        if c.startswith("2") and c != "204"
    }
    assert media[("GET", "/metrics")] == {"text/plain; version=0.0.4"}
    assert media[("GET", "/jobs/{job_id}/frontier.png")] == {"image/png"}
    assert media[("GET", "/jobs/{job_id}/profile")] == {"application/json", "text/csv"}
    # Response models are closed, down to every nested object: drift cannot go unnoticed.
    closed = _closure(doc, response_models | {"Problem"})
    assert {"JobView", "JobStatus", "FrontierStatus", "PlanDoc", "PlanDeployment"} <= closed
    for name in closed:
        for schema in _object_schemas(doc["components"]["schemas"][name]):
            assert schema.get("additionalProperties") is False, name


def test_responses_document_units(http: httpx.Client) -> None:
    comps = http.get("/openapi.json").json()["components"]["schemas"]
    props = comps["PlanDoc"]["properties"]
    assert "(s)" in props["time"]["description"] and "(J)" in props["energy"]["description"]
    assert "MHz" in comps["PlanStep"]["properties"]["frequency"]["description"]
    assert "Watts" in comps["JobView"]["properties"]["blocking_power"]["description"]
    assert set(comps["FrontierStatus"]["required"]) >= {"status", "error", "worker_pid", "stale"}
    assert "points" not in comps["FrontierStatus"]["required"]  # absent before the first solve


# --- the checker ---------------------------------------------------------------------------------


def test_the_checker_fails_on_drift(http: httpx.Client) -> None:
    """A key the schema lacks, a missing key, a wrong type or value: each fails validation."""
    job_id = make_job(http)
    c = Contract(http)
    view = c.call("GET", "/jobs/{job_id}", 200, path={"job_id": job_id}).json()
    status = c.call("GET", "/jobs/{job_id}/status", 200, path={"job_id": job_id}).json()
    job_schema = c.doc["paths"]["/jobs/{job_id}"]["get"]["responses"]["200"]["content"]
    status_schema = c.doc["paths"]["/jobs/{job_id}/status"]["get"]["responses"]["200"]["content"]
    v_job = validator(c.doc, job_schema["application/json"]["schema"])
    v_status = validator(c.doc, status_schema["application/json"]["schema"])
    assert v_job.is_valid(view) and v_status.is_valid(status)
    assert not v_job.is_valid({**view, "surprise": 1})
    assert not v_job.is_valid({k: v for k, v in view.items() if k != "plan_version"})
    assert not v_job.is_valid({**view, "state": "bogus"})
    assert not v_job.is_valid({**view, "schedule": {**view["schedule"], "orders": []}})
    assert not v_status.is_valid({**status, "frontier": {**status["frontier"], "worker_pid": 1}})
    assert not v_status.is_valid({**status, "frontier": {**status["frontier"], "num_points": None}})
    assert not v_status.is_valid({**status, "straggler_detection": {"threshold": 0.05}})


@pytest.fixture()
def local() -> Any:
    """The REST app in process over a fresh service (a TestClient and the service)."""
    service = PerseusService(SqlStore.open(":memory:"), Limits())
    with TestClient(create_app(service), base_url="http://localhost") as client:
        yield client, service


def test_the_wire_format_is_the_services_dicts(local: Any, small_csv: str) -> None:
    """Serialising through the models keeps every key, value and key order of the service."""
    client, service = local
    job_id = service.create_job(JobSpec(stages=2, microbatches=4, blocking_power=70.38))["id"]
    custom = client.post(
        "/jobs",
        json={"blocking_power": 70.0,
            "stages": 2,
            "microbatches": 1,
            "schedule": {"name": "custom", "orders": [[["forward", 0, 0], ["backward", 0, 0]],
                                                      [["forward", 0, 1], ["backward", 0, 1]]]},
        },
    ).json()["id"]  # fmt: skip
    cases = [
        ("/jobs/{}", service.views.job, job_id),
        ("/jobs/{}", service.views.job, custom),
        ("/jobs/{}/status", service.views.status, job_id),
        ("/jobs/{}/frontier", service.frontier_status, job_id),
    ]
    for template, view, arg in cases:
        r = client.get(template.format(arg))
        assert r.status_code == 200, r.text
        assert r.json() == view(arg) and list(r.json()) == list(view(arg)), template
    assert client.get("/jobs").json() == service.jobs_page()
    r = client.put(
        f"/jobs/{job_id}/profile", content=small_csv, headers={"content-type": "text/csv"}
    )
    assert r.json() == service.profiles.summary(job_id)
    for template, view, arg in cases[:1] + cases[2:]:
        r = client.get(template.format(arg))
        assert r.json() == view(arg) and list(r.json()) == list(view(arg)), template
    detection = {"threshold": 0.1, "consecutive": 4, "recovery": 0.05}
    r = client.put(f"/jobs/{job_id}/straggler-detection", json=detection)
    assert list(r.json().items()) == list(detection.items())


def test_an_undeclared_key_is_refused_not_dropped(local: Any, monkeypatch: Any) -> None:
    """A service dict with a key its model lacks fails response validation.

    That is a 500 in production, rather than losing the key or sending an undocumented one.
    """
    client, service = local
    job_id = service.create_job(JobSpec(stages=2, microbatches=4))["id"]
    real = service.views.job
    monkeypatch.setattr(service.views, "job", lambda j: {**real(j), "surprise": 1})
    with pytest.raises(ResponseValidationError, match="surprise"):
        client.get(f"/jobs/{job_id}")


def test_unauthorized_is_a_documented_problem(tmp_path: Any) -> None:
    with (
        ServerProcess(tmp_path / "perseus.db", token="s3cret-token") as srv,
        httpx.Client(base_url=srv.http_url, timeout=30.0) as anon,
    ):
        doc = httpx.get(srv.http_url + "/openapi.json", headers=srv.headers).json()
        c = Contract(anon, doc)
        c.call("GET", "/healthz", 200)
        body = c.call("GET", "/jobs", 401).json()
        assert body["field"] == "Authorization"
        c.call("GET", "/jobs/{job_id}/status", 401, path={"job_id": "x"})
