"""Zeus's pipeline-frequency-optimizer routes under ``/zeus`` (``perseus serve --zeus``).

The four routes of Zeus's PFO server (zeus 0.16.0), answered from Perseus's plans
(:mod:`perseus_server.service.zeus`): an unmodified ``PipelineFrequencyOptimizer`` whose
``server_url`` is ``http://HOST:PORT/zeus`` registers its run, its ranks, and gets each rank's
schedule. Their bodies are Zeus's (``JobInfo``, ``RankInfo``, ``FrequencySchedule``,
``ProfilingResult``); success is exactly 200, as the client demands.

**Credentials in the URL.** The Zeus client sends no header, so on a server that requires tokens
its credential rides in the URL: ``server_url = http://HOST:PORT/zeus/<credential>``.
:class:`ZeusCredentialPath`, in front of the gate, takes it out of the path before anything
sees the request (the routes, the gate's metrics labels, error bodies and logs see
``/zeus/register_job``) and hands it to the gate as the request's bearer credential. Only a
``zeus`` credential is taken from a URL (``POST /credentials {"scope": "zeus", "tenant": T}``):
it opens its tenant's Zeus runs and nothing else; the gate's table
(:mod:`perseus_server.service.authorization`) keeps every other route shut to it. On an open
server (no token) a credential in the URL is ignored.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, ConfigDict, Field, StrictInt
from starlette.types import ASGIApp, Receive, Scope, Send

from perseus_common.clocks import MAX_CLOCK_MHZ
from perseus_server.domain.bounds import MAX_SUPPORTED_CLOCKS
from perseus_server.domain.errors import Unauthorized
from perseus_server.models.base import INT32_MAX, Index, ResponseModel
from perseus_server.rest.docs import operation
from perseus_server.rest.gate import CALLER
from perseus_server.rest.problems import problem_response
from perseus_server.service.authorization import ZEUS_RUN, allow
from perseus_server.service.credentials import Credentials, Forbidden, Principal
from perseus_server.service.credentials import Scope as CredentialScope
from perseus_server.service.zeus import ZeusJobInfo, ZeusRankInfo, ZeusRuns

__all__ = ["PREFIX", "TAG", "ZeusCredentialPath", "zeus_router"]

PREFIX = "/zeus"
#: Zeus's route names: the first segment after ``/zeus`` that is not a credential.
ROUTES = frozenset({"register_job", "register_rank", "schedule", "result"})
TAG = {
    "name": "zeus",
    "description": "Zeus's pipeline-frequency-optimizer routes (``perseus serve --zeus``): a Zeus "
    "client's runs, each an ordinary job made from a prototype job. With tokens, the client's "
    "``server_url`` carries a ``zeus`` credential: ``http://HOST:PORT/zeus/<credential>``.",
}

Degree = Annotated[StrictInt, Field(ge=1, le=INT32_MAX)]
Clock = Annotated[StrictInt, Field(ge=1, le=MAX_CLOCK_MHZ)]
Seconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]


# --- models (Zeus's, zeus/optimizer/pipeline_frequency/common.py) ---------------------------------


class JobInfoIn(BaseModel):
    """Zeus's ``JobInfo``: rank 0 registers the run (fields a later Zeus adds are ignored)."""

    model_config = ConfigDict(extra="ignore")
    job_id: str = Field(default="", max_length=256, description="Must be empty.")
    pp_degree: Degree
    dp_degree: Degree
    tp_degree: Degree
    world_size: Degree = Field(description="pp_degree * dp_degree * tp_degree.")
    job_metadata: str | None = Field(
        default=None,
        max_length=200,
        description="The prototype job: the name or id of a job of the caller's tenant "
        "(empty: the server's ``--zeus-default-prototype``).",
    )


class RankInfoIn(BaseModel):
    """Zeus's ``RankInfo``: a rank of the run registers."""

    model_config = ConfigDict(extra="ignore")
    rank: Index
    dp_rank: Index
    pp_rank: Index
    tp_rank: Index
    available_frequencies: list[Clock] = Field(
        max_length=MAX_SUPPORTED_CLOCKS, description="The GPU's graphics clocks (MHz)."
    )


class ProfilingResultIn(BaseModel):
    """Zeus's ``ProfilingResult`` (the released client never sends it)."""

    model_config = ConfigDict(extra="ignore")
    rank: Index
    iter_time: list[Seconds]
    iter_energy: list[Annotated[float, Field(ge=0, allow_inf_nan=False)]]
    time_breakdown: dict[str, list[list[Seconds]]] = {}
    energy_breakdown: dict[str, list[list[Annotated[float, Field(allow_inf_nan=False)]]]] = {}


class FrequencySchedule(ResponseModel):
    """Zeus's ``FrequencySchedule``: one iteration of a rank's instructions, in order."""

    rank: int
    frequencies: list[tuple[str, int]] = Field(
        description="``[instruction, MHz]`` per instruction (``forward``/``backward``) in the "
        "order the rank runs them (synchronous 1F1B)."
    )


# --- routes ---------------------------------------------------------------------------------------


def _tenant(who: Principal) -> str | None:
    """The tenant whose runs the caller may use (None: the admin, every tenant's)."""
    return None if who.scope is CredentialScope.ADMIN else who.tenant


def zeus_router(runs: ZeusRuns) -> APIRouter:
    """The four Zeus routes over ``runs``."""
    router = APIRouter(tags=["zeus"])

    @router.post(
        f"{PREFIX}/register_job",
        **operation(str, "Register a Zeus run", "The run's job id (a JSON string).", 409, 422),
    )
    @allow(ZEUS_RUN)
    async def register_job(body: JobInfoIn, who: Principal = CALLER) -> str:
        """A new run (an ordinary job) of the prototype ``job_metadata`` names.

        It takes the prototype's profile, frontier and plan policy; ``pp_degree`` must be its
        stages, ``dp_degree`` and ``tp_degree`` are the run's data- and tensor-parallel sizes.
        """
        info = ZeusJobInfo(**body.model_dump())
        return runs.register_job(_tenant(who), info)

    @router.post(
        f"{PREFIX}/register_rank/{{job_id}}",
        **operation(None, "Register a rank of a Zeus run", "Registered.", 404, 409, 422),
    )
    @allow(ZEUS_RUN)
    async def register_rank(
        job_id: str, body: RankInfoIn, request: Request, who: Principal = CALLER
    ) -> None:
        """A rank of the run: its position and its GPU's clocks (checked against the profile)."""
        info = ZeusRankInfo(
            body.rank,
            body.dp_rank,
            body.pp_rank,
            body.tp_rank,
            tuple(body.available_frequencies),
        )
        host = request.client.host if request.client is not None else ""
        runs.register_rank(_tenant(who), job_id, info, host)

    @router.get(
        f"{PREFIX}/schedule/{{job_id}}",
        **operation(
            FrequencySchedule, "A Zeus rank's schedule", "One iteration's clocks.", 404, 409, 422
        ),
    )
    @allow(ZEUS_RUN)
    async def schedule(
        job_id: str, rank: Annotated[int, Query(ge=0, le=INT32_MAX)], who: Principal = CALLER
    ) -> dict[str, Any]:
        """The rank's clock before each instruction of an iteration, in order.

        The plan Perseus deployed for the run (its prototype's policy, under the power budget
        and tenant shares); waits for the run's ranks and plan at most ``--zeus-plan-wait``
        seconds, then answers the max-clock plan (the run's status says why).
        """
        return {"rank": rank, "frequencies": await runs.schedule(_tenant(who), job_id, rank)}

    @router.post(
        f"{PREFIX}/result/{{job_id}}",
        **operation(None, "A Zeus rank's profiling result", "Received.", 404, 409, 422),
    )
    @allow(ZEUS_RUN)
    async def result(job_id: str, body: ProfilingResultIn, who: Principal = CALLER) -> None:
        """Received and counted as contact (Perseus measures through its own clients)."""
        runs.report(_tenant(who), job_id, body.rank)

    return router


# --- the credential in the URL --------------------------------------------------------------------


class ZeusCredentialPath:
    """Pure ASGI middleware: ``/zeus/<credential>/...`` -> ``/zeus/...`` with that credential.

    In front of the gate (see the module docstring). The path is rewritten in the request's own
    scope, so nothing after it (the access log included) sees the credential.
    """

    def __init__(self, app: ASGIApp, *, credentials: Credentials) -> None:
        self.app = app
        self.credentials = credentials

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Take the credential out of a Zeus path; refuse one that is not a zeus credential."""
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if not path.startswith(PREFIX + "/"):
            await self.app(scope, receive, send)
            return
        first, _, rest = path[len(PREFIX) + 1 :].partition("/")
        secret = None
        if first not in ROUTES and first:
            secret = first
            scope["path"] = f"{PREFIX}/{rest}"
            scope["raw_path"] = scope["path"].encode("latin-1", "replace")
        if not self.credentials.enabled:
            await self.app(scope, receive, send)
            return
        headers = scope.get("headers", [])
        if secret is None:
            if not any(k.lower() == b"authorization" for k, _ in headers):
                await problem_response(_missing(), {"WWW-Authenticate": "Bearer"})(
                    scope, receive, send
                )
                return
            await self.app(scope, receive, send)
            return
        who = self.credentials.identify(secret)
        refused = _url_refusal(who)
        if refused is not None:
            await problem_response(refused)(scope, receive, send)
            return
        kept = [(k, v) for k, v in headers if k.lower() != b"authorization"]
        scope["headers"] = [*kept, (b"authorization", b"Bearer " + secret.encode("latin-1"))]
        await self.app(scope, receive, send)


def _missing() -> Unauthorized:
    return Unauthorized(
        "this server requires a credential: give the Zeus client server_url "
        "http://HOST:PORT/zeus/<credential>, with a zeus credential of your tenant (the admin "
        'issues one: POST /credentials {"scope": "zeus", "tenant": ...})',
        field="credential",
    )


def _url_refusal(who: Principal | None) -> Unauthorized | Forbidden | None:
    """Why the credential found in a Zeus URL is refused (None: it is a zeus credential)."""
    if who is None:
        return Unauthorized(
            "the credential in the URL is unknown or revoked: ask the admin for a zeus "
            "credential of your tenant",
            field="credential",
        )
    if who.scope is not CredentialScope.ZEUS:
        return Forbidden(
            f"a {who.scope} credential may not be given in a URL: only a zeus credential "
            '(POST /credentials {"scope": "zeus", "tenant": ...}), which opens its tenant\'s '
            "Zeus runs and nothing else",
            field="credential",
        )
    return None
