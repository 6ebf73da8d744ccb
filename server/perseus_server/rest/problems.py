"""Errors as RFC 9457 problem documents: the service's :class:`ApiError`, request validation
and routing errors (404, 405) all answer ``application/problem+json`` with the field at fault."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from perseus_server.domain.errors import ApiError, BadRequest
from perseus_server.models.base import ResponseModel, omitted

__all__ = ["PROBLEM", "FieldError", "Problem", "problem_response", "install_error_handlers"]

PROBLEM = "application/problem+json"


class FieldError(ResponseModel):
    """One invalid input of a request that failed validation."""

    field: str = Field(description="The input at fault, dotted (``schedule.orders``).")
    message: str


class Problem(ResponseModel):
    """What went wrong, and the input at fault."""

    type: str = Field(description="Always ``about:blank``: the status says it all.")
    title: str = Field(description="The status in words (``Not found``).")
    status: int = Field(description="The HTTP status code.")
    detail: str = Field(description="What is wrong, for a person to read.")
    field: str = omitted("The input at fault: a body field, a query or path parameter, a header.")
    row: int = omitted("Profile errors: the 1-based CSV line (header: 1) or JSON record index.")
    limit: int = omitted("413: the body limit (bytes).")
    scope: str = omitted("403: the scope the operation needs (``admin`` or ``read``).")
    errors: list[FieldError] = omitted("422 from request validation: each invalid input (<= 20).")
    lowest_power: float = omitted(
        "Power budgets: the lowest achievable average power (W) of the job or jobs."
    )


def problem_response(err: ApiError, headers: dict[str, str] | None = None) -> JSONResponse:
    """``err`` as a problem document with its status (and its own headers: ``Retry-After``)."""
    headers = {**err.headers(), **(headers or {})}
    return JSONResponse(err.problem(), status_code=err.status, media_type=PROBLEM, headers=headers)


def _field_of(loc: tuple[Any, ...], kind: str = "") -> str:
    if kind == "json_invalid":
        return "body"
    parts = [str(p) for p in loc]
    if parts and parts[0] in ("body", "query", "path", "header"):
        parts = parts[1:]
    # Drop pydantic's union-member tags (``ScheduleIn``, ``literal['a','b']``, ``function-after[...]``).
    parts = [p for p in parts if not (p[:1].isupper() or "[" in p or "'" in p)]
    return ".".join(parts) or "body"


def install_error_handlers(app: FastAPI) -> None:
    """Render every client error of ``app`` as a problem document."""

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return problem_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {"loc": ("body",), "msg": "invalid request"}
        field = _field_of(tuple(first.get("loc", ("body",))), str(first.get("type", "")))
        detail = f"{field}: {first.get('msg', 'invalid')}"
        if len(errors) > 1:
            detail += f" (and {len(errors) - 1} more)"
        err = BadRequest(
            detail,
            field=field,
            errors=[
                {
                    "field": _field_of(tuple(e.get("loc", ())), str(e.get("type", ""))),
                    "message": str(e.get("msg", "")),
                }
                for e in errors[:20]
            ],
        )
        return problem_response(err)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        field = {404: "path", 400: "body"}.get(exc.status_code)
        err = ApiError(str(exc.detail), field=field)
        err.status = exc.status_code
        err.title = {400: "Bad request", 404: "Not found", 405: "Method not allowed"}.get(
            exc.status_code, "Error"
        )
        return problem_response(err, dict(exc.headers or {}))
