"""Who may talk to an open server (no token) from a browser.

DNS rebinding and cross-site requests.

Without a token, anything that can reach the port can drive the server, and a web page in the
operator's browser can reach a loopback port: by a name it controls that resolves to 127.0.0.1
(DNS rebinding: the request carries ``Host: attacker.example``), or by a cross-site ``POST``
a browser sends without asking (a ``text/plain`` body needs no CORS preflight). So an open
server

* answers only requests whose ``Host`` is a loopback name (``localhost``, ``*.localhost``,
  ``127.0.0.0/8``, ``::1``) or one given with ``--allowed-host`` (a request without ``Host``,
  which no browser sends, is let through);
* refuses a state-changing request (any method but ``GET``, ``HEAD``, ``OPTIONS``) whose
  ``Origin`` names another host, or is ``null``, or whose ``Sec-Fetch-Site`` is ``cross-site``;
* sends no CORS headers (no ``Access-Control-Allow-Origin``), so a foreign page can read none
  of its answers.

Both refusals are 403 problem bodies naming the header. With a token, the bearer credential
(which a browser never attaches to a cross-site request on its own) guards every route instead.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from urllib.parse import urlsplit

from starlette.types import Scope

from perseus_server.domain.errors import ApiError

__all__ = ["Origins", "SAFE_METHODS", "host_name", "is_loopback_name"]

#: Methods that change nothing (a foreign ``Origin`` on them is harmless: CORS stays closed).
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def host_name(host: str) -> str:
    """The name of a ``Host`` header or an origin's authority, normalised.

    Without port, brackets, case or trailing dot (``"[::1]:8000"`` -> ``"::1"``).
    """
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    if host.count(":") == 1:
        host = host.split(":", 1)[0]
    return host.rstrip(".")


def is_loopback_name(name: str) -> bool:
    """Whether ``name`` (from :func:`host_name`) always means this machine."""
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _forbidden(detail: str, field: str) -> ApiError:
    err = ApiError(detail, field=field)
    err.status, err.title = 403, "Forbidden"
    return err


class Origins:
    """The host names an open server answers (loopback ones and ``allowed``)."""

    def __init__(self, allowed: Iterable[str] = ()) -> None:
        self.allowed = frozenset(host_name(h) for h in allowed if h.strip())
        self._seen: dict[str, bool] = {}  # answers for the names last asked (a few dozen)

    def allows(self, name: str) -> bool:
        """Whether ``name`` is a loopback name or an allowed one.

        Remembered: an address is otherwise parsed on every request.
        """
        known = self._seen.get(name)
        if known is None:
            known = is_loopback_name(name) or name in self.allowed
            if len(self._seen) >= 64:
                self._seen.clear()
            self._seen[name] = known
        return known

    def refusal(self, scope: Scope, headers: Mapping[str, str]) -> ApiError | None:
        """Why an open server refuses this request (None: it does not)."""
        host = headers.get("host")
        if host is not None and not self.allows(host_name(host)):
            return _forbidden(
                f"host {host_name(host)[:64]!r} is not a loopback name nor an allowed host of "
                "this server without a token (see --allowed-host)",
                "Host",
            )
        if str(scope.get("method", "")) in SAFE_METHODS:
            return None
        origin = headers.get("origin")
        if origin is not None:
            name = host_name(urlsplit(origin.strip()).netloc) if origin.strip() != "null" else ""
            if not name or not self.allows(name):
                return _forbidden(
                    f"a request from origin {origin[:64]!r} may not change this server's state",
                    "Origin",
                )
        if headers.get("sec-fetch-site", "").strip().lower() == "cross-site":
            return _forbidden("a cross-site request may not change this server's state", "Origin")
        return None
