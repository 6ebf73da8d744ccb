"""``GET /docs``: Swagger UI over ``/openapi.json``, served from the package.

Nothing comes from elsewhere (an air-gapped cluster has no CDN).

The page's script and style sheet are the Swagger UI distribution that the ``fastapi-offline``
package ships (a dependency of the ``server`` extra); the page itself and its start-up script
are written here, so no inline script is needed and the page runs under a Content-Security-
Policy that names no other host (as ``/ui`` does). Swagger UI's online validator, which would
send the schema's address elsewhere, is off.

The page, its assets and ``/openapi.json`` are public: they hold no data, and the schema has to
load before the page's *Authorize* button (the ``bearer`` scheme the schema declares, see
:mod:`perseus_server.rest.docs`) can take a credential. Every call *Try it out* makes goes
through the REST API and its bearer-token check. Like ``/ui``, the files are answered by a small
ASGI layer outside the token gate, for ``GET``/``HEAD`` of exactly these paths.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from importlib import resources
from typing import Any

from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["CSP", "DOCS_PATHS", "install_swagger", "swagger_assets"]

#: Where the Swagger UI distribution comes from: package, folder.
ASSETS_PACKAGE = ("fastapi_offline", "static")

#: Served path -> (file of the distribution, media type).
DOCS_PATHS: dict[str, tuple[str, str]] = {
    "/docs/swagger-ui-bundle.js": ("swagger-ui-bundle.js", "text/javascript; charset=utf-8"),
    "/docs/swagger-ui.css": ("swagger-ui.css", "text/css; charset=utf-8"),
    "/docs/favicon.png": ("favicon.png", "image/png"),
}

#: Only this origin: the page's scripts and styles, the schema and the API calls. Swagger UI
#: sets style attributes as it renders (hence ``'unsafe-inline'`` for styles only) and draws
#: its icons as ``data:`` SVG.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; form-action 'none'; frame-ancestors 'none'; "
    "base-uri 'none'"
)

# Relative addresses, so the page also works behind a proxy that serves it under a prefix.
PAGE = b"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>Perseus API</title>
<link rel="icon" type="image/png" href="docs/favicon.png">
<link rel="stylesheet" href="docs/swagger-ui.css">
</head>
<body>
<div id="swagger-ui"></div>
<script src="docs/swagger-ui-bundle.js"></script>
<script src="docs/start.js"></script>
</body>
</html>
"""

START = b"""window.ui = SwaggerUIBundle({
  url: "openapi.json",
  dom_id: "#swagger-ui",
  presets: [SwaggerUIBundle.presets.apis],
  layout: "BaseLayout",
  deepLinking: true,
  validatorUrl: null,
  persistAuthorization: false,
  displayRequestDuration: true,
});
"""


def swagger_assets() -> dict[str, tuple[bytes, str]]:
    """Served path -> (body, media type) of the page and its files, read from the package."""
    base = resources.files(ASSETS_PACKAGE[0]).joinpath(ASSETS_PACKAGE[1])
    files = {path: (base.joinpath(name).read_bytes(), media) for path, (name, media) in DOCS_PATHS.items()}  # fmt: skip
    files["/docs"] = (PAGE, "text/html; charset=utf-8")
    files["/docs/start.js"] = (START, "text/javascript; charset=utf-8")
    return files


class _DocsFront:
    """ASGI: the page, its files and ``/openapi.json`` answered from memory; the rest passed on.

    For ``GET``/``HEAD``; the schema is serialised once, on its first request.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        files: dict[str, tuple[bytes, str]],
        schema: Callable[[], dict[str, Any]],
    ) -> None:
        self.app, self.files, self.schema = app, files, schema
        self._schema_body: bytes | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or scope.get("method") not in ("GET", "HEAD"):
            await self.app(scope, receive, send)
            return
        if path == "/docs/":
            await _send(send, scope, 308, b"", [(b"location", b"../docs")])
            return
        if path == "/openapi.json":
            if self._schema_body is None:
                self._schema_body = json.dumps(self.schema(), separators=(",", ":")).encode()
            await _send(send, scope, 200, self._schema_body, _headers("application/json"))
            return
        hit = self.files.get(path)
        if hit is None:
            await self.app(scope, receive, send)
            return
        body, media = hit
        await _send(send, scope, 200, body, _headers(media))


def _headers(media: str) -> list[tuple[bytes, bytes]]:
    return [
        (b"content-type", media.encode()),
        (b"cache-control", b"no-cache"),
        (b"x-content-type-options", b"nosniff"),
        (b"content-security-policy", CSP.encode()),
        (b"referrer-policy", b"no-referrer"),
    ]


async def _send(
    send: Send, scope: Scope, status: int, body: bytes, headers: list[tuple[bytes, bytes]]
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [*headers, (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body})


def install_swagger(app: FastAPI) -> None:
    """Serve ``/docs`` and ``/openapi.json`` on ``app``, outside its token gate.

    Call it after the gate is added: the last middleware added is the outermost. Create ``app``
    with ``docs_url``, ``redoc_url`` and ``openapi_url`` ``None``: these answers replace
    FastAPI's.
    """
    app.add_middleware(_DocsFront, files=swagger_assets(), schema=lambda: app.openapi())
