"""Path and query parameters several routes share, bounded so Postgres can hold every value."""

from __future__ import annotations

from typing import Annotated, Final

from fastapi import Path, Query

from orchestrator.schemas.base import MAX_TAGS, TAG_PATTERN
from workflows.names import NAME_RE

__all__ = [
    "MAX_OFFSET",
    "NAME_PATTERN",
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
# Worker ids are what their operators chose: any printable text the column (128) holds.
WorkerFilter = Annotated[
    str | None,
    Query(max_length=128, pattern=r"^[^\x00-\x1f\x7f]*$", description="Only this worker's runs."),
]
