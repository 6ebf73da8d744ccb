"""The REST API (FastAPI): jobs, profiles, frontiers, plans, profiling, stragglers, status.

Errors are RFC 9457 problem documents (``application/problem+json``) with a ``field`` naming the
input at fault. With a token configured every route except ``/healthz`` needs
``Authorization: Bearer <token>``. Bodies are capped (see :class:`~perseus_server.config.Limits`).
Every request and response body has a pydantic model, published at ``/openapi.json``; each
router module declares the models of its routes next to them (the job status's in
:mod:`.job_status`; the frontier and plan routes' still in :mod:`perseus_server.models`).

Modules: :mod:`.app` (assembles the routers), one router per feature (:mod:`.monitoring`,
:mod:`.jobs`, :mod:`.profiles`, :mod:`.plans`, :mod:`.stragglers`, :mod:`.power_budget`,
:mod:`.credentials`, :mod:`.tenants`), :mod:`.docs` (how operations are documented),
:mod:`.gate` (token, body cap, metrics), :mod:`.problems` (error rendering and the problem
document), the pages :mod:`.swagger` and :mod:`.ui`.
"""

from perseus_server.rest.app import create_app

__all__ = ["create_app"]
