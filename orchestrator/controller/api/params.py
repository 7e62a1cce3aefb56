"""Path and query parameters several routes share, bounded so Postgres can hold every value."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Final

from fastapi import Path, Query
from pydantic import BeforeValidator

from orchestrator.schemas.base import MAX_TAGS, TAG_PATTERN
from workflows.names import NAME_RE

__all__ = [
    "MAX_OFFSET",
    "NAME_PATTERN",
    "DateTimeFilter",
    "DefinitionName",
    "NameFilter",
    "ResourceName",
    "TagFilter",
    "TaskName",
    "WorkerFilter",
]

MAX_OFFSET: Final = 2**63 - 1  # Postgres' OFFSET is a bigint
NAME_PATTERN: Final = NAME_RE.pattern
_NAME: Final = f"^{NAME_RE.pattern}$"
_NAME_HELP: Final = "1-64 letters, digits, '_' or '-', starting with a letter."

TaskName = Annotated[str, Path(pattern=_NAME, description=_NAME_HELP)]
DefinitionName = Annotated[str, Path(pattern=_NAME, description=_NAME_HELP)]
ResourceName = Annotated[str, Path(pattern=_NAME, description=_NAME_HELP)]  # schedule, webhook
TagFilter = Annotated[
    list[Annotated[str, Query(pattern=TAG_PATTERN)]] | None,
    Query(max_length=MAX_TAGS, description="Only runs with this tag (repeat: with every one)."),
]
NameFilter = Annotated[
    str | None, Query(pattern=_NAME, description="Workflow definition name. " + _NAME_HELP)
]
# RFC 3339 (the schema's date-time), the offset optional (then UTC) and ' ' for 'T' allowed:
# what ISO 8601 writes. Pydantic alone would also take a number as a Unix time ("0.5").
_DATE_TIME: Final = re.compile(
    r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}(:\d{2}(\.\d{1,9})?)?([Zz]|[+-]\d{2}:?\d{2})?"
)


def _iso_date_time(value: object) -> object:
    if isinstance(value, str) and not _DATE_TIME.fullmatch(value):
        raise ValueError(
            f"{value!r} is not a date and time; write it as ISO 8601 does, e.g. "
            "2026-01-31T12:00:00Z"
        )
    return value


DateTimeFilter = Annotated[datetime | None, BeforeValidator(_iso_date_time)]
# Worker ids are what their operators chose: any printable text the column (128) holds.
WorkerFilter = Annotated[
    str | None,
    Query(max_length=128, pattern=r"^[^\x00-\x1f\x7f]*$", description="Only this worker's runs."),
]
