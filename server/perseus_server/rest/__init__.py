"""The REST API (FastAPI): jobs, profiles, frontiers, plans, profiling, stragglers, status.

Errors are RFC 9457 problem documents (``application/problem+json``) with a ``field`` naming the
input at fault. With a token configured every route except ``/healthz`` needs
``Authorization: Bearer <token>``. Bodies are capped (see :class:`~perseus_server.config.Limits`).
Every response body has a pydantic model (:mod:`perseus_server.models`), published at
``/openapi.json``.

Modules: :mod:`.app` (assembles the routers), one router per feature (:mod:`.status`,
:mod:`.jobs`, :mod:`.profiles`, :mod:`.plans`, :mod:`.stragglers`, :mod:`.power`,
:mod:`.credentials`), :mod:`.docs` (how operations are documented), :mod:`.gate` (token, body
cap, metrics), :mod:`.problems` (error rendering), the pages :mod:`.swagger` and :mod:`.ui`.
"""

from perseus_server.rest.app import create_app

__all__ = ["create_app"]
