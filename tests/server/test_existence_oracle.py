"""No existence oracle: another tenant's job answers exactly as an id no job has.

One real ``perseus serve`` with two tenants. Every route of the app (walked from its own router,
so a route added tomorrow is walked too) and every gRPC method (from the ``.proto``) is called
by each credential kind scoped to one tenant or job (tenant, tenant-read, rank) twice: naming a
job of another tenant (with a profile: it has everything a route could read), then an id of
the same length that no job has; the id in the path, in the query (``job_id``, ``after``) and
in a JSON body, wherever a route might read one. Everything the caller can observe must be the same, the id
aside: the status, the body, the headers (the date aside), and the deltas of the caller's own
``/metrics``. Then the same over raw sockets with a body of 20 MB announced and none sent,
and with a body that stalls half way: both answered at once, alike.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from perseus_common.proto import perseus_pb2 as pb
from perseus_server import ServerProcess
from perseus_server.service.credentials import Scope

from .routes import app_routes

ADMIN = "the-admin-token"
JOB = {"stages": 2, "microbatches": 2, "blocking_power": 70.0}
#: Callers scoped to one tenant or one job (the admin and read kinds see every tenant).
SCOPED = (Scope.TENANT, Scope.TENANT_READ, Scope.RANK)
SERVICE = pb.DESCRIPTOR.services_by_name["PlanService"]
#: Sample lines of the Prometheus text: ``name{labels} value``.
_SAMPLE = re.compile(r"^([^#\s][^\s]*)\s+(\S+)$")


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _unknown_like(job_id: str) -> str:
    """An id of the same length and alphabet as ``job_id`` that no job has (hex reversed)."""
    return "".join("0123456789abcdef"[15 - int(c, 16)] for c in job_id)


class World:
    """The server, the caller's credentials, and the other tenant's job."""

    def __init__(self, srv: ServerProcess, admin: httpx.Client, csv: str) -> None:
        self.srv, self.admin = srv, admin
        self.tokens: dict[Scope, str] = {}
        for scope in (Scope.TENANT, Scope.TENANT_READ):
            r = admin.post("/credentials", json={"scope": scope.value, "tenant": "team-a"})
            assert r.status_code == 201, r.text
            self.tokens[scope] = r.json()["credential"]
        own = admin.post("/jobs", json={**JOB, "tenant": "team-a"}).json()
        self.own_job, self.tokens[Scope.RANK] = own["id"], own["rank_credential"]
        other = admin.post("/jobs", json={**JOB, "tenant": "team-b"}).json()
        self.foreign, self.foreign_rank_token = other["id"], other["rank_credential"]
        r = admin.put(
            f"/jobs/{self.foreign}/profile", content=csv, headers={"content-type": "text/csv"}
        )
        assert r.status_code == 200, r.text
        self.unknown = _unknown_like(self.foreign)
        assert admin.get(f"/jobs/{self.unknown}").status_code == 404

    def metrics(self) -> dict[str, float]:
        """The caller's own ``/metrics`` (its tenant's series), sample by sample."""
        r = self.admin.get("/metrics", headers=_bearer(self.tokens[Scope.TENANT]))
        assert r.status_code == 200, r.text
        out = {}
        for line in r.text.splitlines():
            m = _SAMPLE.match(line)
            if m:
                out[m.group(1)] = float(m.group(2))
        return out

    def observed(self, call: Callable[[str], Any]) -> list[tuple[Any, dict[str, float]]]:
        """``call`` on the foreign id, then on the unknown one: each answer, its metric deltas.

        In each answer the id (and the tenant named with it) reads ``<id>`` (``<tenant>``).
        """
        seen = []
        before = self.metrics()
        for job_id in (self.foreign, self.unknown):
            got = call(job_id)
            after = self.metrics()
            delta = {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k)}
            seen.append((_masked(got, job_id, self.tenant_for(job_id)), delta))
            before = after
        return seen

    def tenant_for(self, job_id: str) -> str:
        """The tenant named alongside ``job_id``: the other tenant's, or one of none."""
        return "team-b" if job_id == self.foreign else "team-z"


def _masked(value: Any, job_id: str, tenant: str) -> Any:
    if isinstance(value, str):
        return value.replace(job_id, "<id>").replace(tenant, "<tenant>")
    if isinstance(value, bytes):
        return value.replace(job_id.encode(), b"<id>").replace(tenant.encode(), b"<tenant>")
    if isinstance(value, tuple | list):
        return type(value)(_masked(v, job_id, tenant) for v in value)
    return value


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, small_csv: str) -> Iterator[World]:
    d = tmp_path_factory.mktemp("oracle")
    # A short body timeout: a server that waits for a stalled body answers within this.
    args = ["--body-timeout", "3"]
    with (
        ServerProcess(d / "perseus.db", token=ADMIN, extra_args=args) as srv,
        httpx.Client(base_url=srv.http_url, headers=_bearer(ADMIN), timeout=60.0) as admin,
    ):
        for tenant in ("team-a", "team-b"):
            r = admin.post("/tenants", json={"id": tenant})
            assert r.status_code == 201, r.text
        yield World(srv, admin, small_csv)


def _routes(tmp: Path) -> list[tuple[str, str]]:
    """Every ``(method, template)`` of the app, from its own router."""
    return sorted({(m, r.path) for r in app_routes(tmp, token="x") for m in r.methods})


def _path(world: World, template: str, job_id: str) -> str:
    """``template`` naming ``job_id``: its tenant for ``{tenant_id}``, the id for any other."""
    path = template.replace("{tenant_id}", world.tenant_for(job_id))
    return re.sub(r"\{[^}]+\}", job_id, path)


def _body(method: str, template: str, job_id: str) -> tuple[bytes, str]:
    """What a request carries: a profile for a profile upload, else the id in a JSON body."""
    if method in ("GET", "HEAD", "DELETE"):
        return b"", ""
    if template.endswith("/profile"):
        return b"stage,instruction,frequency,time,energy\n0,forward,1410,0.01,2.0\n", "text/csv"
    return f'{{"job_id": "{job_id}"}}'.encode(), "application/json"


def _answer(r: httpx.Response) -> tuple[int, list[tuple[str, str]], bytes]:
    """Status, headers but the date, and body.

    The liveness page's uptime (and so its length) is masked: it names no job.
    """
    body, clock = re.subn(rb'"uptime_seconds":[0-9.e+-]+', b"", r.content)
    volatile = {"date", "content-length"} if clock else {"date"}
    headers = sorted((k, v) for k, v in r.headers.items() if k.lower() not in volatile)
    return r.status_code, headers, body


def test_every_route_answers_another_tenants_job_as_an_unknown_one(
    tmp_path: Path, world: World
) -> None:
    walked = 0
    with httpx.Client(base_url=world.srv.http_url, timeout=60.0) as http:
        for method, template in _routes(tmp_path):
            for kind in SCOPED:

                def call(
                    job_id: str, method: str = method, template: str = template, kind: Scope = kind
                ) -> Any:
                    content, ctype = _body(method, template, job_id)
                    headers = _bearer(world.tokens[kind]) | (
                        {"content-type": ctype} if ctype else {}
                    )
                    r = http.request(
                        method,
                        _path(world, template, job_id),
                        params={"job_id": job_id, "after": job_id},
                        content=content,
                        headers=headers,
                    )
                    return _answer(r)

                (foreign, d_foreign), (unknown, d_unknown) = world.observed(call)
                where = f"{method} {template} as {kind}"
                assert foreign == unknown, f"{where}:\n{foreign}\n{unknown}"
                assert d_foreign == d_unknown, f"{where}: metrics {d_foreign} != {d_unknown}"
                assert foreign[0] < 500, f"{where}: {foreign}"
                walked += 1
    assert walked == len(_routes(tmp_path)) * len(SCOPED)
    # Nothing was changed by any of it: the other tenant's job is as it was.
    view = world.admin.get(f"/jobs/{world.foreign}").json()
    assert view["profile"] is not None and view["plan_version"] == 0, view


def _raw(world: World, method: str, path: str, token: str, length: int, sent: bytes) -> bytes:
    """One request over a raw socket, announcing ``length`` body bytes and sending ``sent``.

    The answer as read (status line, headers but the date, body): the server must answer
    without the rest of the body, which never comes (a server that waits for it answers when
    its body timeout ends, differently).
    """
    url = httpx.URL(world.srv.http_url)
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: {url.host}:{url.port}\r\n"
        f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n"
    )
    with socket.create_connection((url.host, url.port)) as s:
        s.settimeout(120)  # a guard against a hang only: every answer comes within seconds
        s.sendall(head.encode() + sent)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            if not chunk:
                return data
            data += chunk
        top, _, body = data.partition(b"\r\n\r\n")
        lines = top.split(b"\r\n")
        fields = [ln for ln in lines[1:] if not ln.lower().startswith(b"date:")]
        size = next(
            (int(ln.split(b":")[1]) for ln in fields if ln.lower().startswith(b"content-length:")),
            0,
        )
        while len(body) < size:
            chunk = s.recv(65536)
            if not chunk:
                break
            body += chunk
    return b"\r\n".join([lines[0], *sorted(fields), b"", body])


@pytest.mark.parametrize(
    ("case", "length", "sent"),
    [("oversized", 20_000_000, b""), ("stalled", 4096, b'{"job_id": ')],
)
def test_a_body_is_neither_sized_nor_awaited_before_the_job_is_known_to_be_visible(
    tmp_path: Path, world: World, case: str, length: int, sent: bytes
) -> None:
    walked = 0
    for method, template in _routes(tmp_path):
        if "{job_id}" not in template:
            continue
        for kind in SCOPED:
            token = world.tokens[kind]

            def call(
                job_id: str, method: str = method, template: str = template, token: str = token
            ) -> bytes:
                return _raw(world, method, _path(world, template, job_id), token, length, sent)

            (foreign, d_foreign), (unknown, d_unknown) = world.observed(call)
            where = f"{case} {method} {template} as {kind}"
            assert foreign == unknown, f"{where}:\n{foreign!r}\n{unknown!r}"
            assert d_foreign == d_unknown, f"{where}: metrics {d_foreign} != {d_unknown}"
            status = foreign.split(b"\r\n", 1)[0]
            assert status.split(b" ")[1] in (b"403", b"404"), f"{where}: {status!r}"
            walked += 1
    assert walked >= 20 * len(SCOPED)


def _grpc_request(name: str, job_id: str, rank_id: str) -> bytes:
    """A request of method ``name`` (its type from the ``.proto``) naming the job and rank."""
    from google.protobuf import message_factory

    cls = message_factory.GetMessageClass(SERVICE.methods_by_name[name].input_type)
    fields = cls.DESCRIPTOR.fields_by_name
    given: dict[str, Any] = {"job_id": job_id, "rank_id": rank_id, "hostname": "n"}
    given |= {"global_rank": 1, "pipeline_rank": 1, "iteration": 1, "iteration_time": 0.1}
    msg = cls(**{k: v for k, v in given.items() if k in fields})
    return msg.SerializeToString()  # type: ignore[no-any-return]


def _grpc_call(ch: grpc.Channel, name: str, request: bytes, token: str) -> Any:
    """The call's outcome: its code, details and trailing metadata."""
    method = SERVICE.methods_by_name[name]
    path = f"/{SERVICE.full_name}/{name}"
    md = (("authorization", f"Bearer {token}"),)
    same: Callable[[bytes], bytes] = lambda b: b  # noqa: E731
    try:
        if method.client_streaming:
            ch.stream_unary(path, same, same)(iter([request]), metadata=md, timeout=30)
        elif method.server_streaming:
            stream = ch.unary_stream(path, same, same)(request, metadata=md, timeout=30)
            next(iter(stream))
            stream.cancel()
        else:
            ch.unary_unary(path, same, same)(request, metadata=md, timeout=30)
    except grpc.RpcError as e:
        trailing = sorted((k, str(v)) for k, v in (e.trailing_metadata() or ()))
        return e.code().name, e.details(), trailing
    return "OK", "", []


def test_every_grpc_method_answers_another_tenants_job_as_an_unknown_one(world: World) -> None:
    # A rank of the other tenant's job, registered by its own rank credential.
    with grpc.insecure_channel(world.srv.grpc_target) as ch:
        reg = pb.RegisterRankRequest(
            job_id=world.foreign, global_rank=0, pipeline_rank=0, hostname="n"
        )
        registered = pb.RegisterRankResponse.FromString(
            _grpc_raw_register(ch, reg.SerializeToString(), world.foreign_rank_token)
        )
        rank_id = registered.rank_id
        assert world.foreign in rank_id
        walked = 0
        for name in SERVICE.methods_by_name:
            for kind in SCOPED:

                def call(job_id: str, name: str = name, kind: Scope = kind) -> Any:
                    request = _grpc_request(name, job_id, rank_id.replace(world.foreign, job_id))
                    return _grpc_call(ch, name, request, world.tokens[kind])

                (foreign, d_foreign), (unknown, d_unknown) = world.observed(call)
                where = f"{name} as {kind}"
                assert foreign == unknown, f"{where}:\n{foreign}\n{unknown}"
                assert d_foreign == d_unknown, f"{where}: metrics {d_foreign} != {d_unknown}"
                assert foreign[0] == "PERMISSION_DENIED", f"{where}: {foreign}"
                walked += 1
    assert walked == len(SERVICE.methods_by_name) * len(SCOPED)


def _grpc_raw_register(ch: grpc.Channel, request: bytes, token: str) -> bytes:
    same: Callable[[bytes], bytes] = lambda b: b  # noqa: E731
    path = f"/{SERVICE.full_name}/RegisterRank"
    md = (("authorization", f"Bearer {token}"),)
    return ch.unary_unary(path, same, same)(request, metadata=md, timeout=30)  # type: ignore[no-any-return]
