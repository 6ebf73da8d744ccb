"""Errors the service raises on bad requests; REST maps them to problem bodies, gRPC to codes."""

from __future__ import annotations

from typing import Any

__all__ = [
    "ApiError",
    "BadRequest",
    "Conflict",
    "NotFound",
    "StoreUnavailable",
    "TooLarge",
    "Unauthorized",
    "Unavailable",
]


#: The longest detail an error carries (characters): a detail quotes what it refuses, and a
#: 100,000-character value quoted back would exceed gRPC's metadata limit (the client would
#: see its stream "removed" instead of the error) and bloat every problem body.
MAX_DETAIL = 1024


class ApiError(Exception):
    """A client error: an HTTP status, a short title, a detail and the field at fault.

    The detail has at most :data:`MAX_DETAIL` characters.
    """

    status: int = 400
    title: str = "Bad request"

    def __init__(self, detail: str, *, field: str | None = None, **extra: Any) -> None:
        if len(detail) > MAX_DETAIL:
            detail = detail[: MAX_DETAIL - 1] + "\u2026"
        super().__init__(detail)
        self.detail = detail
        self.field = field
        self.extra = extra

    def problem(self) -> dict[str, Any]:
        """The RFC 9457 problem document of this error."""
        body: dict[str, Any] = {
            "type": "about:blank",
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
        }
        if self.field is not None:
            body["field"] = self.field
        body.update(self.extra)
        return body

    def headers(self) -> dict[str, str]:
        """HTTP headers the answer carries besides the problem body (none by default)."""
        return {}


class BadRequest(ApiError):
    """The request is malformed or inconsistent (HTTP 422, gRPC INVALID_ARGUMENT)."""

    status = 422
    title = "Invalid request"


class NotFound(ApiError):
    """The job, rank or resource does not exist (HTTP 404, gRPC NOT_FOUND)."""

    status = 404
    title = "Not found"


class Conflict(ApiError):
    """The request does not fit the job's current state (HTTP 409, gRPC FAILED_PRECONDITION)."""

    status = 409
    title = "Conflict"


class TooLarge(ApiError):
    """The request body exceeds its documented limit (HTTP 413)."""

    status = 413
    title = "Request body too large"


class Unauthorized(ApiError):
    """A bearer token is configured and the request lacks it (HTTP 401, gRPC UNAUTHENTICATED)."""

    status = 401
    title = "Unauthorized"


class Unavailable(ApiError):
    """The server cannot take the request now, through no fault of the client's.

    Retry after ``retry_after`` seconds (HTTP 503 with ``Retry-After``, gRPC UNAVAILABLE).
    """

    status = 503
    title = "Service unavailable"

    def __init__(self, detail: str, *, retry_after: int, field: str | None = None) -> None:
        super().__init__(detail, field=field, retry_after=retry_after)
        self.retry_after = retry_after

    def headers(self) -> dict[str, str]:
        """The ``Retry-After`` header of the HTTP answer."""
        return {"Retry-After": str(self.retry_after)}


class StoreUnavailable(Unavailable):
    """The store cannot write now (``kind``: ``disk_full``); nothing of the request was stored.

    The same request succeeds once the cause is gone (space freed).
    """

    def __init__(self, detail: str, *, kind: str, retry_after: int) -> None:
        super().__init__(detail, retry_after=retry_after)
        self.kind = kind
        self.extra["kind"] = kind
