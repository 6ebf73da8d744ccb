"""The error body of every 4xx answer: an RFC 9457 problem document (``application/problem+json``).

Rendered by :meth:`perseus_server.domain.errors.ApiError.problem` and the REST layer's exception
handlers; this model documents that shape in OpenAPI.
"""

from __future__ import annotations

from pydantic import Field

from perseus_server.models.base import ResponseModel, omitted

__all__ = ["FieldError", "Problem"]


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
