"""How each REST operation is documented in OpenAPI.

Its response model, its error answers, the media types of its bodies.

:func:`operation` builds the keyword arguments of a route decorator: the response model
(serialised with ``exclude_unset``, so a key is on the wire exactly when the service set it),
a summary, the 2xx description and the problem documents of the errors it can answer.
:func:`install_openapi` files those problems under ``application/problem+json`` (what the
handlers send), removes FastAPI's default validation-error schema, which this API never sends,
and declares the bearer credential (:data:`BEARER`) on every operation but the public ones, so
``/docs``'s *Authorize* button can send it.

:func:`built_response` sends a large document the service built itself (the job status) without
the model's validation, which costs as much as building it (see the function).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import ResponseValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticSerializationError, to_json

from perseus_server.rest.problems import PROBLEM, Problem

__all__ = ["BEARER", "ERRORS", "built_response", "operation", "install_openapi"]

#: The name of the security scheme: ``Authorization: Bearer <credential>``.
BEARER = "bearer"

SECURITY_SCHEMES: dict[str, Any] = {
    BEARER: {
        "type": "http",
        "scheme": "bearer",
        "description": "The admin token, or a credential from `POST /credentials` (`read` or "
        "`admin` scope). Needed only when the server is started with a token.",
    }
}

#: When each error status is answered (the body is always a :class:`Problem`).
ERRORS: dict[int, str] = {
    401: "A bearer token is configured and the request lacks it (or it is wrong).",
    403: "The credential is valid but its scope does not allow this (``scope`` names the one "
    "needed): a read credential on a route that changes state, a rank credential on REST.",
    404: "The job, or the resource ``field`` names, does not exist.",
    409: "The request does not fit the job's current state; ``field`` names what is in the way.",
    413: "The body exceeds its limit (``limit``, bytes).",
    422: "The request is invalid; ``field`` names the input at fault.",
}


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The ``responses`` entries of these error statuses."""
    return {c: {"model": Problem, "description": ERRORS[c]} for c in sorted(codes)}


def operation(
    model: Any,
    summary: str,
    returns: str,
    *codes: int,
    status: int = 200,
    public: bool = False,
    content: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Route-decorator keywords.

    ``model`` documents the ``status`` body (and, when the endpoint returns a dict, validates
    and serialises it), ``returns`` describes it, ``codes`` are the error statuses it can answer
    (401 and 403 are added unless ``public``) and ``content`` adds other media types of that body.
    """
    ok: dict[str, Any] = {"description": returns}
    if content:
        ok["content"] = content
    return {
        "status_code": status,
        "response_model": model,
        "response_model_exclude_unset": True,
        "summary": summary,
        "response_description": returns,
        "responses": {status: ok, **errors(*codes, *(() if public else (401, 403)))},
    }


def built_response(doc: dict[str, Any], model: type[BaseModel], status: int = 200) -> Response:
    """``doc``, a document of plain JSON values the service built, as the route's response.

    It is serialised as it is (``pydantic_core.to_json``) rather than validated through
    ``model`` first.

    At 4,096 ranks (512 pipelines) the job status is 350 KiB, and its validation took as long
    as building it, on the event loop. The wire format is the model's: the keys the service
    set, in its order, compact JSON, a non-finite float as ``null``
    (``tests/server/rest/test_docs_fast_path.py`` checks the bytes against the model's path; the
    OpenAPI contract tests check the documents against the schema). A document with a value of
    a type that is not plain JSON takes the model's path, as other routes do (a key the model
    lacks is then a :class:`~fastapi.exceptions.ResponseValidationError`).
    """
    try:
        body = to_json(doc, inf_nan_mode="null")
    except PydanticSerializationError:
        try:
            body = model.model_validate(doc).model_dump_json(exclude_unset=True).encode()
        except ValidationError as e:
            raise ResponseValidationError(e.errors(), body=doc) from None
    return Response(body, status_code=status, media_type="application/json")


def _refs(node: Any) -> set[str]:
    """Every component name ``node`` refers to (``$ref: #/components/schemas/<name>``)."""
    if isinstance(node, dict):
        out = {str(node["$ref"]).rsplit("/", 1)[-1]} if "$ref" in node else set()
        for v in node.values():
            out |= _refs(v)
        return out
    if isinstance(node, list):
        return set().union(*(_refs(v) for v in node)) if node else set()
    return set()


def _tidy(schema: dict[str, Any], public: frozenset[str]) -> None:
    """Tidy the OpenAPI document: problems under their media type, no default 422, bearer auth.

    No FastAPI default 422 (our 422 is a problem too); the bearer scheme on every operation but
    the ``public`` paths.
    """
    schema.setdefault("components", {})["securitySchemes"] = SECURITY_SCHEMES
    for path, ops in schema.get("paths", {}).items():
        for op in ops.values():
            op["security"] = [] if path in public else [{BEARER: []}]
            responses = op.get("responses", {})
            for code, resp in list(responses.items()):
                body = resp.get("content", {})
                if "HTTPValidationError" in _refs(body):
                    del responses[code]
                elif code.startswith("4"):
                    # FastAPI files the model under the route's media type (JSON, PNG, text).
                    schemas = [v for v in body.values() if "schema" in v]
                    resp["content"] = {PROBLEM: schemas[0]} if schemas else {}
    comps = schema.get("components", {}).get("schemas", {})
    used = _refs(schema.get("paths", {}))
    for name in ("HTTPValidationError", "ValidationError"):
        if name not in used:
            comps.pop(name, None)


def install_openapi(app: FastAPI, public: frozenset[str]) -> None:
    """Serve the tidied schema at ``/openapi.json`` (built once, on first request).

    ``public``: the paths that need no credential (no bearer scheme on their operations).
    """

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title,
                version=app.version,
                description=app.description,
                routes=app.routes,
                tags=app.openapi_tags,
            )
            _tidy(schema, public)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
