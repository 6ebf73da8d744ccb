"""The REST application, assembled from one router per feature.

Each route declares its response model (see :mod:`perseus_server.rest.docs`); FastAPI validates
the service's dict against it and serialises it, so ``/openapi.json`` documents what is sent.
``GET /jobs/{id}/plan`` is the exception: the service caches its body as bytes per frontier
point (the query benchmark's hot path), and it is sent as is; its model documents it. The job
status (``GET /jobs/{id}/status`` and the straggler routes that answer it) is encoded as the
service built it, without the model's validation (:func:`~perseus_server.rest.docs.built_response`).

The routers: :mod:`.monitoring` (liveness, metrics), :mod:`.jobs` (with a job's status), :mod:`.profiles`
(uploads and online profiling), :mod:`.plans` (frontier and plans), :mod:`.stragglers`,
:mod:`.power_budget` (the cluster power budget), :mod:`.credentials`, :mod:`.tenants`, and with
``perseus serve --zeus`` :mod:`.zeus` (Zeus's routes); the pages outside the gate,
:mod:`.swagger` (``/docs``, ``/openapi.json``) and :mod:`.ui` (``/ui``).
"""

from __future__ import annotations

from collections.abc import Sequence

from fastapi import FastAPI

from perseus_server.config import ZeusConfig
from perseus_server.rest import credentials as credential_routes
from perseus_server.rest import (
    jobs,
    monitoring,
    plans,
    power_budget,
    profiles,
    stragglers,
    tenants,
    zeus,
)
from perseus_server.rest.docs import install_openapi
from perseus_server.rest.gate import Gate, public_paths, route_rules
from perseus_server.rest.plan_fast_path import PlanAnswerFront, PlanQueriesFirst
from perseus_server.rest.problems import install_error_handlers
from perseus_server.rest.swagger import install_swagger
from perseus_server.rest.ui import install_ui
from perseus_server.service import PerseusService
from perseus_server.service.credentials import Credentials

__all__ = ["create_app", "TAGS"]

#: The OpenAPI tags, one or two per router, in the order the docs page shows them.
TAGS = [
    monitoring.TAG,
    jobs.TAG,
    *profiles.TAGS,
    *plans.TAGS,
    stragglers.TAG,
    power_budget.TAG,
    credential_routes.TAG,
    tenants.TAG,
]


def create_app(
    service: PerseusService,
    *,
    token: str | None = None,
    credentials: Credentials | None = None,
    allowed_hosts: Sequence[str] = (),
    zeus_routes: ZeusConfig | None = None,
) -> FastAPI:
    """The REST application over ``service`` (state is passed explicitly, no globals).

    ``credentials`` (default: just the admin ``token``, issued ones in the service's store);
    ``allowed_hosts``: host names an open server answers besides loopback ones;
    ``zeus_routes``: mount Zeus's routes under ``/zeus`` with these settings (None: not).
    """
    credentials = credentials or service.authority(token)
    routers = [
        *([zeus.zeus_router(service.zeus_runs(zeus_routes))] if zeus_routes is not None else []),
        monitoring.status_router(service),
        jobs.jobs_router(service, credentials),
        profiles.profiles_router(service),
        plans.plans_router(service),
        stragglers.stragglers_router(service),
        power_budget.power_router(service),
        credential_routes.credentials_router(service, credentials),
        tenants.tenants_router(service),
    ]
    # Each route declares who may call it (@allow): the gate's rows of the authorization table.
    rules = route_rules(route for router in routers for route in router.routes)
    # plan queries go to the gate first (rest/plan_fast_path.py); the rest as in any FastAPI app
    app = PlanQueriesFirst(
        title="Perseus",
        version="0.1.0",
        description="Energy scheduler for pipeline-parallel training: time-energy frontiers and "
        "per-instruction GPU frequency plans. Times are in seconds, energies in joules per "
        "iteration, powers in watts, clocks in MHz. Errors are RFC 9457 problem documents "
        "(`application/problem+json`) whose `field` names the input at fault. With a token "
        "configured, every route except `/healthz` needs `Authorization: Bearer <credential>`: "
        "the admin token opens everything, a read credential reads, a tenant's credential "
        "its tenant's jobs only (another tenant's answer 404; 403 beyond its kind).",
        openapi_tags=TAGS if zeus_routes is None else [*TAGS, zeus.TAG],
        # /docs and /openapi.json are served by rest/swagger.py (offline, outside the gate)
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    # inside the gate (the last added is the outermost): answers only what the gate let in
    app.add_middleware(PlanAnswerFront, service=service)
    app.add_middleware(
        Gate,
        owner=service.tenant_of,
        credentials=credentials,
        rules=rules,
        limits=service.limits,
        metrics=service.metrics,
        allowed_hosts=allowed_hosts,
        writes=service.write_limits,
    )
    if zeus_routes is not None:  # outside the gate: it hands the gate the URL's credential
        app.add_middleware(zeus.ZeusCredentialPath, credentials=credentials)
    install_error_handlers(app)
    install_openapi(app, public_paths(rules))
    for router in routers:
        app.include_router(router)
    install_swagger(app)  # /docs and /openapi.json, outside the gate
    install_ui(app, auth=credentials.enabled)  # the page's own middleware: keep it added last
    # Built now, once: the gate reads the routes' templates from it at its first unrouted
    # request (a refusal, a kept plan answer), where building it took 0.3-5 s on the loop.
    app.openapi()
    return app
