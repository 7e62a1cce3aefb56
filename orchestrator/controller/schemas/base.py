"""What every body shares: strict request bodies, response bodies read from rows or ORM
objects, and the rules for names that the schema documents and the validators check."""

from __future__ import annotations

from typing import Annotated, Any, Final

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from workflows.names import MODULE_PATH_RE, NAME_RE, name_problem

__all__ = [
    "MAX_DESCRIPTION",
    "MAX_TAGS",
    "MODULE_RULE",
    "NAME_RULE",
    "PRIORITY_MAX",
    "PRIORITY_MIN",
    "TAG_PATTERN",
    "RequestBody",
    "ResponseBody",
    "Tags",
    "checked_name",
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


class RequestBody(BaseModel):
    # A misspelt field is an error, not ignored; NaN and infinities are no numbers here.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class ResponseBody(BaseModel):
    model_config = ConfigDict(from_attributes=True)


def checked_name(kind: str, value: str) -> str:
    problem = name_problem(kind, value)
    if problem is not None:
        raise ValueError(problem)
    return value
