"""What every model shares: a closed schema, fields that may be left out, common field types.

A response model is complete: ``extra="forbid"`` makes its JSON schema say
``additionalProperties: false``, so a key the service adds without declaring it fails response
validation (and the OpenAPI conformance test) instead of being dropped or documented nowhere.

The REST layer serialises with ``exclude_unset``: a key is on the wire exactly when the service
put it there. :func:`omitted` declares a key that some responses leave out (it is never ``null``
when present); a field whose value may be ``null`` is declared ``T | None`` without a default.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Annotated, Any, get_type_hints

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    StrictInt,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import core_schema

__all__ = [
    "INT32_MAX",
    "Index",
    "JsonKey",
    "JsonView",
    "OptTimestamp",
    "ResponseModel",
    "Timestamp",
    "omitted",
]

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


@dataclass(frozen=True)
class JsonKey:
    """One key of a value's JSON form: the value's attribute it holds, and its description."""

    attribute: str
    description: str | None = None


class JsonView:
    """How a value of ours (a frozen dataclass, such as the wire's ``PlanStep``) reads in JSON.

    Annotate the value's class with it, ``Annotated[PlanStep, JsonView(...)]``, and a response
    model holds the value itself: validation builds the value from the ``keys`` given, and
    serialisation writes them, in their order, each from its attribute (unless the caller asks
    for ``by_alias=False``: then the attributes' names). Its schema is titled with the class's name
    and described by ``description``; every key is required and extra keys are forbidden, as in
    a :class:`ResponseModel`. The keys name each attribute of the class exactly once (else a
    :class:`TypeError` when the model is built), so a value's new field cannot go undocumented.
    """

    def __init__(self, description: str, **keys: JsonKey) -> None:
        self.description = description
        self.keys = keys

    def __get_pydantic_core_schema__(
        self, source: type[Any], handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        """The value's dataclass schema under the JSON keys (pydantic's hook)."""
        hints = get_type_hints(source)
        attributes = [key.attribute for key in self.keys.values()]
        if sorted(attributes) != sorted(f.name for f in fields(source)):
            raise TypeError(f"{source.__name__}: JSON keys for {attributes}, not its fields")
        args = [
            core_schema.dataclass_field(
                key.attribute,
                handler.generate_schema(hints[key.attribute]),
                validation_alias=name,
                serialization_alias=name,
                metadata=_described(name, key.description),
            )
            for name, key in self.keys.items()
        ]
        description = self.description

        def describe(schema: Any, to_json: GetJsonSchemaHandler) -> JsonSchemaValue:
            return {**to_json(schema), "description": description}

        return core_schema.dataclass_schema(
            source,
            core_schema.dataclass_args_schema(source.__name__, args),
            attributes,
            slots=hasattr(source, "__slots__"),
            frozen=True,
            config={"extra_fields_behavior": "forbid", "serialize_by_alias": True},
            ref=f"{source.__module__}.{source.__qualname__}:json-view",
            metadata={"pydantic_js_functions": [describe]},
        )


def _described(name: str, description: str | None) -> dict[str, Any] | None:
    """A field's schema metadata: its title and description, as a model field's would be."""
    if description is None:
        return None
    title = name.title().replace("_", " ").strip()  # pydantic's title of a field name
    return {"pydantic_js_updates": {"title": title, "description": description}}
