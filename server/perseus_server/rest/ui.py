"""``GET /ui``: the operator's page.

The page is ``server/perseus_server/ui/``: HTML, JS and CSS shipped as package data, no build step,
nothing from elsewhere.

The page and its two assets are public: they hold no data, and the page has to load before it
can ask for a credential. Every data call the page makes goes through the REST API and its
bearer-token check. So the files are served by a small ASGI layer outside the token gate
(:func:`install_ui` adds it as the outermost middleware); it answers ``GET``/``HEAD`` of
exactly these paths and passes everything else on, untouched.

The page learns from a ``<meta name="perseus-auth">`` tag whether to ask for a credential
before its first call (so it never sends one that is bound to be refused).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources

from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["UI_PATHS", "UiFiles", "install_ui", "load_ui"]

#: Served path -> (file in ``perseus_server/ui``, media type).
UI_PATHS: dict[str, tuple[str, str]] = {
    "/ui": ("index.html", "text/html; charset=utf-8"),
    "/ui/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/ui/style.css": ("style.css", "text/css; charset=utf-8"),
}

#: Only what the page itself serves: its script, its style sheet, API calls to this origin.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'"
)


@dataclass(frozen=True)
class UiFiles:
    """The page's files, read once: served path -> (body, media type)."""

    files: dict[str, tuple[bytes, str]]


def load_ui(*, auth: bool) -> UiFiles:
    """Read the page's files from the package; ``auth``: the API needs a credential."""
    base = resources.files("perseus_server").joinpath("ui")
    files = {}
    for path, (name, media) in UI_PATHS.items():
        body = base.joinpath(name).read_bytes()
        if name == "index.html":
            body = body.replace(b"{{auth}}", b"required" if auth else b"none")
        files[path] = (body, media)
    return UiFiles(files)


class _UiFront:
    """ASGI: ``GET``/``HEAD`` of a :data:`UI_PATHS` path answered from memory.

    The rest is passed on. ``/ui/`` redirects to ``/ui`` (the page's relative links assume it).
    """

    def __init__(self, app: ASGIApp, *, ui: UiFiles) -> None:
        self.app, self.ui = app, ui

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or scope.get("method") not in ("GET", "HEAD"):
            await self.app(scope, receive, send)
            return
        if path == "/ui/":
            await self._send(send, 308, b"", [(b"location", b"../ui")])
            return
        hit = self.ui.files.get(path)
        if hit is None:
            await self.app(scope, receive, send)
            return
        body, media = hit
        headers = [
            (b"content-type", media.encode()),
            (b"cache-control", b"no-cache"),
            (b"x-content-type-options", b"nosniff"),
            (b"content-security-policy", CSP.encode()),
            (b"referrer-policy", b"no-referrer"),
        ]
        await self._send(send, 200, b"" if scope["method"] == "HEAD" else body, headers, len(body))

    @staticmethod
    async def _send(
        send: Send,
        status: int,
        body: bytes,
        headers: list[tuple[bytes, bytes]],
        length: int | None = None,
    ) -> None:
        n = len(body) if length is None else length
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [*headers, (b"content-length", str(n).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})


def install_ui(app: FastAPI, *, auth: bool) -> None:
    """Serve the page on ``app``, outside its token gate.

    Call it after the gate is added: the last middleware added is the outermost.
    """
    app.add_middleware(_UiFront, ui=load_ui(auth=auth))
