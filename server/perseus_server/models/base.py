"""What every model shares: a closed schema, fields that may be left out, common field types.

A response model is complete: ``extra="forbid"`` makes its JSON schema say
``additionalProperties: false``, so a key the service adds without declaring it fails response
validation (and the OpenAPI conformance test) instead of being dropped or documented nowhere.

The REST layer serialises with ``exclude_unset``: a key is on the wire exactly when the service
put it there. :func:`omitted` declares a key that some responses leave out (it is never ``null``
when present); a field whose value may be ``null`` is declared ``T | None`` without a default.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt

__all__ = ["INT32_MAX", "Index", "OptTimestamp", "ResponseModel", "Timestamp", "omitted"]

#: Largest value of an int32 wire field: indices beyond it could not travel to a rank.
INT32_MAX = 2**31 - 1

#: An index that travels to a rank (a pipeline, a global rank).
Index = Annotated[StrictInt, Field(ge=0, le=INT32_MAX)]

Timestamp = Annotated[float, Field(description="Seconds since the Unix epoch.")]
OptTimestamp = Annotated[float | None, Field(description="Seconds since the Unix epoch, or null.")]


class ResponseModel(BaseModel):
    """Base of the response models: unknown keys are an error, never silently dropped."""

    model_config = ConfigDict(extra="forbid")


def _drop_default(schema: dict[str, Any]) -> None:
    schema.pop("default", None)


def omitted(description: str) -> Any:
    """A field that is absent from some responses (the schema shows no default for it)."""
    return Field(default=None, description=description, json_schema_extra=_drop_default)
