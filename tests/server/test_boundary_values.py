"""Every REST route and gRPC method, fed boundary values, answers 2xx or a client error.

Fed the boundary values of each of its fields, answers 2xx or a client error naming the field,
within a bounded time (each call has a deadline; one that hangs fails) and memory (the server's
resident memory over the whole walk).

The fields and their types come from the application's own OpenAPI document (query and path
parameters, the top-level properties of each JSON body, ``$ref`` resolved) and from the proto
descriptors (each request's fields, and the fields of one element of each repeated message);
the boundary values from each field's type: 0, -1, the 32- and 64-bit edges, 1e308, NaN and
infinities (as JSON's non-standard tokens and as strings), the smallest subnormal, empty and
over-long strings, NUL, wrong types, null, a long list. Each case changes one field of a valid
request (a real, solved job; a registered rank), so the answer is about that field. A field that
takes only numbers refuses a boolean or a number written as text, naming the field, whatever
state the request meets (never read as 1, never parsed from the text). Complements
``test_fuzz.py`` (schemathesis' random cases, only checked for 5xx).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from google.protobuf.descriptor import FieldDescriptor

from perseus_common.proto import perseus_pb2 as pb
from perseus_common.proto import perseus_pb2_grpc as pb_grpc
from perseus_server import ServerProcess

from .conftest import register, solved_job

pytestmark = pytest.mark.slow

#: A valid body per request model (the base each case changes one field of); a model the
#: OpenAPI document gains without one here fails the walk, naming it.
BODIES: dict[str, dict[str, Any]] = {
    "JobIn": {"stages": 2, "microbatches": 4, "schedule": "1f1b", "blocking_power": 70.0},
    "PlanSelect": {"index": 0},
    "ProfilingIn": {},
    "StragglerIn": {"pipeline": 0, "slowdown": 1.5},
    "DetectionIn": {"threshold": 0.1, "consecutive": 3},
    "PowerBudgetIn": {"watts": 100_000.0},
    "CredentialIn": {"scope": "read"},
    # The walk's tenant exists before the walk (``TENANT``): creating it again is the state's
    # own answer (409) whatever a valid field says, and an invalid one is a 422 naming it.
    "TenantIn": {"id": "walk", "weight": 1.0},
    "TenantPatch": {"weight": 1.0},
}
#: The tenant the walk's tenant routes name.
TENANT = "walk"
#: The most the server's memory may grow over the whole walk (MiB).
MEMORY_BOUND_MIB = 200
#: Each call's deadline (s): a call still unanswered by then fails the test.
DEADLINE = 15.0
LONG = 100_000

NUMBERS: list[Any] = [0, -1, 2**31, 2**63, -(2**63), 10**30, 1e308, -1e308, 5e-324, 1.5]
NUMBERS += [math.nan, math.inf, -math.inf, "NaN", "Infinity", "1e999"]
STRINGS: list[Any] = ["", "x" * LONG, "\x00", "-1", "..", "\u202e"]
WRONG: list[Any] = [None, True, False, "abc", "2", "1e5", [], {}, [0] * LONG]
QUERY = ["0", "-1", "2147483648", "9223372036854775808", "1e308", "NaN", "inf", "-inf"]
QUERY += ["", "x" * 4000, "9" * 400, "true", "[]", "%00"]


def body_values(schema: dict[str, Any]) -> list[Any]:
    """The boundary values of one JSON field (its type's edges, then wrong types)."""
    kinds = {schema.get("type")} | {s.get("type") for s in schema.get("anyOf", [])}
    out: list[Any] = []
    if kinds & {"integer", "number"}:
        out += NUMBERS
    if "string" in kinds or not kinds - {None}:
        limit = schema.get("maxLength")
        out += STRINGS + ([] if limit is None else ["y" * (limit + 1)])
    if "array" in kinds:
        out += [[], [None], [-1], [math.nan], ["x" * LONG]]
    return out + WRONG


def is_numeric(schema: dict[str, Any]) -> bool:
    """Whether a JSON field takes only numbers (or null)."""
    kinds = {schema.get("type")} | {s.get("type") for s in schema.get("anyOf", [])}
    kinds -= {None, "null"}
    return bool(kinds) and kinds <= {"integer", "number"}


def names_field(r: httpx.Response, name: str) -> bool:
    """Whether the problem names ``name``.

    As its field (or a part of it), one of its errors' fields, or in its detail (a rule between
    two fields names both there).
    """
    doc = r.json()
    fields = [str(doc.get("field") or "")] + [str(e.get("field")) for e in doc.get("errors", [])]
    return name in str(doc.get("detail", "")) or any(
        f == name or f.startswith(name + ".") or f.endswith("." + name) for f in fields
    )


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


class Walk:
    """The REST walk's state: a real solved job, and what failed."""

    def __init__(self, http: httpx.Client, job: str, spec: dict[str, Any]) -> None:
        self.http, self.job, self.spec = http, job, spec
        self.failures: list[str] = []
        self.cases = 0

    def resolve(self, schema: dict[str, Any]) -> dict[str, Any]:
        ref = schema.get("$ref")
        return self.spec["components"]["schemas"][ref.rsplit("/", 1)[1]] if ref else schema

    def call(self, method: str, path: str, body: Any = None, **kw: Any) -> httpx.Response:
        """One request; a body is sent as JSON with NaN and infinities as their bare tokens.

        What a careless client's encoder writes.
        """
        self.cases += 1
        if body is not None:
            kw["content"] = json.dumps(body, allow_nan=True)
            kw["headers"] = {"content-type": "application/json"}
        path = path.replace("{job_id}", self.job).replace("{tenant_id}", TENANT)
        return self.http.request(method, path, **kw)

    def refused(self, what: str, name: str, r: httpx.Response) -> None:
        """A value that must be refused (a client error naming ``name``), whatever the state."""
        if not 400 <= r.status_code < 500:
            self.failures.append(f"{what}: {r.status_code}, not refused: {r.text[:200]}")
        else:
            self.check(what, name, 0, r)

    def check(self, what: str, name: str, base: int, r: httpx.Response) -> None:
        if r.status_code < 400 or (r.status_code == base and base >= 400):
            return  # taken, or the state's own answer (a 409 whatever the field says)
        if r.status_code >= 500:
            self.failures.append(f"{what}: {r.status_code} {r.text[:200]}")
        elif not r.headers.get("content-type", "").startswith("application/problem+json"):
            self.failures.append(f"{what}: {r.status_code} without a problem body")
        elif not names_field(r, name):
            self.failures.append(f"{what}: {r.status_code} names {r.text[:200]}, not {name}")


@pytest.fixture(scope="module")
def job(http: httpx.Client, small_csv: str) -> str:
    return solved_job(http, small_csv, data_parallel=2)


def _operations(spec: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in spec["paths"].items():
        for method, op in item.items():
            if method == "delete" and path.count("{") and not op.get("parameters", [])[1:]:
                continue  # deleting the walk's own job or credential: only its path, below
            yield method.upper(), path, op


def test_every_route_answers_each_fields_boundary_values(
    server: ServerProcess, http: httpx.Client, job: str
) -> None:
    spec = http.get("/openapi.json").json()
    assert http.post("/tenants", json={"id": TENANT}).status_code == 201
    walk = Walk(http, job, spec)
    rss0 = rss_mib(server.pid)
    for method, path, op in _operations(spec):
        content = op.get("requestBody", {}).get("content", {}).get("application/json", {})
        model = content.get("schema", {}).get("$ref", "").rsplit("/", 1)[-1]
        if model and model not in BODIES:
            walk.failures.append(f"{method} {path}: no valid {model} body to start from")
            continue
        body = BODIES.get(model) if model else None
        query = [p for p in op.get("parameters", []) if p["in"] == "query"]
        props = walk.resolve(content["schema"]).get("properties", {}) if model else {}
        if not query and not props:
            continue
        base = walk.call(method, path, body).status_code
        for p in query:
            for v in QUERY:
                r = walk.call(method, path, body, params={p["name"]: v})
                walk.check(f"{method} {path}?{p['name']}={v[:20]!r}", p["name"], base, r)
        for name, schema in props.items():
            numeric = is_numeric(walk.resolve(schema))
            for v in body_values(walk.resolve(schema)):
                r = walk.call(method, path, {**(body or {}), name: v})
                what = f"{method} {path} {name}={str(v)[:20]!r}"
                if numeric and isinstance(v, bool | str):
                    walk.refused(what, name, r)  # never read as 1 or parsed from text
                else:
                    walk.check(what, name, base, r)
    for method, path, name in (
        ("GET", "/jobs/{}", "job_id"),
        ("GET", "/jobs/{}/status", "job_id"),
        ("DELETE", "/credentials/{}", "credential_id"),
    ):
        for v in ["x" * 2000, "%00", "%E2%80%AE", "-1", "0"]:  # ("" is another route)
            r = http.request(method, path.format(v))
            walk.check(f"{method} {path} with {v[:20]!r}", name, 0, r)
    grown = rss_mib(server.pid) - rss0
    assert not walk.failures, "\n".join(walk.failures[:30])
    assert walk.cases > 500
    assert grown < MEMORY_BOUND_MIB, f"the server grew {grown:.0f} MiB over the walk"
    assert http.get("/healthz").status_code == 200


# --- gRPC -----------------------------------------------------------------------------------

_INTS = [0, -1, 2**31 - 1, -(2**31)]
_INT64 = [*_INTS, 2**63 - 1, -(2**63)]
_DOUBLES = [0.0, -1.0, 1e308, -1e308, 5e-324, math.nan, math.inf, -math.inf]
_TEXT = ["", "x" * LONG, "\x00", "..", "\u202e"]


def proto_values(f: FieldDescriptor) -> list[Any]:
    """The boundary values of one proto field (a repeated one: as one-element and long lists)."""
    one: list[Any] = {
        FieldDescriptor.TYPE_INT32: _INTS,
        FieldDescriptor.TYPE_UINT32: [0, 2**32 - 1],
        FieldDescriptor.TYPE_INT64: _INT64,
        FieldDescriptor.TYPE_UINT64: [0, 2**64 - 1],
        FieldDescriptor.TYPE_DOUBLE: _DOUBLES,
        FieldDescriptor.TYPE_FLOAT: _DOUBLES,
        FieldDescriptor.TYPE_STRING: _TEXT,
        FieldDescriptor.TYPE_BOOL: [True, False],
    }.get(f.type, [])
    if f.is_repeated:
        return [[v] for v in one] + [[one[0]] * 100_000] if one else []
    return one


def _cases(msg: Any) -> Iterator[tuple[str, Any]]:
    """(field path, a copy of ``msg`` with that field at one boundary value)."""
    for f in msg.DESCRIPTOR.fields:
        if f.message_type is not None:
            if not f.is_repeated:
                continue
            element = getattr(msg, f.name)[0] if len(getattr(msg, f.name)) else None
            if element is None:
                continue
            for sub in element.DESCRIPTOR.fields:
                for v in proto_values(sub):
                    case = type(msg)()
                    case.CopyFrom(msg)
                    item = getattr(case, f.name)[0]
                    if sub.is_repeated:
                        del getattr(item, sub.name)[:]
                        getattr(item, sub.name).extend(v)
                    else:
                        setattr(item, sub.name, v)
                    yield f"{f.name}.{sub.name}", case
            continue
        for v in proto_values(f):
            case = type(msg)()
            case.CopyFrom(msg)
            if f.is_repeated:
                del getattr(case, f.name)[:]
                getattr(case, f.name).extend(v)
            else:
                setattr(case, f.name, v)
            yield f.name, case


def test_every_grpc_method_answers_each_fields_boundary_values(
    server: ServerProcess, stub: pb_grpc.PlanServiceStub, http: httpx.Client, job: str
) -> None:
    reg = register(stub, job, 1, 1, data_rank=0)
    rank = reg.rank_id
    version = http.get(f"/jobs/{job}/status").json()["plan"]["version"]
    report = pb.IterationReport(
        job_id=job, rank_id=rank, iteration=1, iteration_time=1.0, plan_version=version
    )
    report.instructions.add(instruction="forward", microbatch=0, frequency_mhz=1410, time=0.01)
    report.transfers.add(boundary=0, direction="backward", microbatch=0, time=0.001)
    report.off_plan.add(instruction="forward", microbatch=0, locked_mhz=1005, sampled_mhz=900)
    bases = {
        "RegisterRank": pb.RegisterRankRequest(
            job_id=job, global_rank=1, pipeline_rank=1, gpu_name="NVIDIA A40", hostname="h"
        ),
        "WatchPlan": pb.WatchPlanRequest(job_id=job, rank_id=rank),
        "ReportIterations": report,
        "FinishRank": pb.FinishRankRequest(job_id=job, rank_id=rank),
    }
    service = pb.DESCRIPTOR.services_by_name["PlanService"]
    for m in service.methods:
        # A request of only job_id and rank_id is built from the .proto: a new such method
        # needs nothing here.
        if m.name not in bases and {f.name for f in m.input_type.fields} == {"job_id", "rank_id"}:
            bases[m.name] = getattr(pb, m.input_type.name)(job_id=job, rank_id=rank)
    methods = {m.name for m in service.methods}
    assert methods == set(bases), methods ^ set(bases)
    failures: list[str] = []
    rss0 = rss_mib(server.pid)

    def call(method: str, req: Any) -> None:
        if method == "ReportIterations":
            stub.ReportIterations(iter([req]), timeout=DEADLINE)
        elif method == "WatchPlan":
            stream = stub.WatchPlan(req, timeout=2.0)
            try:
                next(stream)
            except grpc.RpcError as e:
                if e.code() is not grpc.StatusCode.DEADLINE_EXCEEDED:  # open, nothing new
                    raise
            finally:
                stream.cancel()
        else:
            getattr(stub, method)(req, timeout=DEADLINE)

    for method, base in bases.items():
        if method == "FinishRank":
            continue  # last: it may finish the job
        for name, case in _cases(base):
            try:
                call(method, case)
            except grpc.RpcError as e:
                code, details = e.code(), e.details() or ""
                last = name.rsplit(".", 1)[-1]
                if code in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL):
                    failures.append(f"{method} {name}: {code.name} {details[:200]}")
                elif code is grpc.StatusCode.DEADLINE_EXCEEDED:
                    failures.append(f"{method} {name}: no answer within {DEADLINE} s")
                elif code is grpc.StatusCode.RESOURCE_EXHAUSTED and "bytes exceed" in details:
                    pass  # the whole request is over its method's size: the request is at fault
                elif last not in details and name not in details:
                    failures.append(f"{method} {name}: {code.name} {details[:200]!r}")
    for name, case in _cases(bases["FinishRank"]):
        try:
            call("FinishRank", case)
        except grpc.RpcError as e:
            if name not in (e.details() or "") and "bytes exceed" not in (e.details() or ""):
                failures.append(f"FinishRank {name}: {e.code().name} {(e.details() or '')[:200]}")
    grown = rss_mib(server.pid) - rss0
    assert not failures, "\n".join(failures[:30])
    assert grown < MEMORY_BOUND_MIB, f"the server grew {grown:.0f} MiB over the walk"
