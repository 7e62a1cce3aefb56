"""What every body shares: strict request bodies, response bodies read from rows or ORM
objects (and, by a client, from the JSON of an API newer than itself), and the rules for
names that the schema documents and the validators check."""

from __future__ import annotations

import enum
from typing import Annotated, Any, Final, TypeVar

from pydantic import BaseModel, ConfigDict, Field, GetJsonSchemaHandler, StringConstraints
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from workflows.names import MODULE_PATH_RE, NAME_RE, name_problem

__all__ = [
    "MAX_DESCRIPTION",
    "MAX_TAGS",
    "MODULE_RULE",
    "NAME_RULE",
    "PRIORITY_MAX",
    "PRIORITY_MIN",
    "TAG_PATTERN",
    "OpenEnum",
    "RequestBody",
    "ResponseBody",
    "Tags",
    "checked_name",
    "whole_number",
]

# Documented in the schema (clients and the fuzzer see the rule); checked by the validators,
# whose messages say more than a pattern mismatch would.
NAME_RULE: Final[dict[str, Any]] = {"pattern": f"^{NAME_RE.pattern}$", "maxLength": 64}
MODULE_RULE: Final[dict[str, Any]] = {"pattern": f"^{MODULE_PATH_RE.pattern}$"}
MAX_DESCRIPTION: Final = 2000
# A run's priority: waiting runs are served highest first.
PRIORITY_MIN: Final = -100
PRIORITY_MAX: Final = 100
# A tag: letters, digits and a few separators ("nightly", "team:vision", "env=prod").
TAG_PATTERN: Final = r"^[A-Za-z0-9_.:=/+@-]{1,64}$"
MAX_TAGS: Final = 16
Tags = Annotated[
    list[Annotated[str, StringConstraints(pattern=TAG_PATTERN)]], Field(max_length=MAX_TAGS)
]


def whole_number(value: object) -> object:
    """A ``mode="before"`` field validator: a JSON integer as JSON Schema reads it (``5`` or
    ``5.0``) or null, never ``true`` or ``"5"`` (which pydantic's lax mode would take for 1 and
    5; its strict mode refuses ``5.0``)."""
    if value is None:
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("a whole number is needed")
    if isinstance(value, float) and not value.is_integer():
        raise ValueError("a whole number is needed")
    return value


class RequestBody(BaseModel):
    # A misspelt field is an error, not ignored; NaN and infinities are no numbers here. Each
    # body's validator is built when first used: a client imports them all and uses a few.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class ResponseBody(BaseModel):
    """What the API answers. The API builds it from rows that hold more than it shows, so
    fields it does not declare are dropped; ``cdiflow.client`` reads it with ``extra="allow"``
    and keeps the fields of a newer API in ``model_extra``."""

    model_config = ConfigDict(from_attributes=True, defer_build=True)


E = TypeVar("E", bound=enum.Enum)


class _DocumentedAsEnum:
    """The schema of an ``OpenEnum`` is its enum's: the words the API answers with today."""

    def __get_pydantic_json_schema__(
        self, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        either: JsonSchemaValue = handler(core_schema)
        enum_schema: JsonSchemaValue = either["anyOf"][0]
        return enum_schema


# A word of an enum in an answer: the member when this version knows it, else the word as
# sent, so a client older than the API reads a status (or policy, role, ...) added since.
OpenEnum = Annotated[E | str, Field(union_mode="left_to_right"), _DocumentedAsEnum()]


def checked_name(kind: str, value: str) -> str:
    problem = name_problem(kind, value)
    if problem is not None:
        raise ValueError(problem)
    return value
