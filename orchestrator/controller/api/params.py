"""Path and query parameters several routes share, bounded so Postgres can hold every value."""

from __future__ import annotations

from typing import Annotated, Final

from fastapi import Path, Query

from workflows.names import NAME_RE

__all__ = [
    "MAX_ID",
    "MAX_OFFSET",
    "CursorParam",
    "DefinitionName",
    "NameFilter",
    "TaskName",
    "WorkerFilter",
]

MAX_ID: Final = 2**63 - 1  # a bigint id
# An offset costs the rows it skips: deep pages go by cursor.
MAX_OFFSET: Final = 10_000
_NAME: Final = f"^{NAME_RE.pattern}$"
_NAME_HELP: Final = "1-64 letters, digits, '_' or '-', starting with a letter."

TaskName = Annotated[str, Path(pattern=_NAME, description=_NAME_HELP)]
DefinitionName = Annotated[str, Path(pattern=_NAME, description=_NAME_HELP)]
NameFilter = Annotated[
    str | None, Query(pattern=_NAME, description="Workflow definition name. " + _NAME_HELP)
]
CursorParam = Annotated[
    str | None,
    Query(
        max_length=200,
        description="Where the page starts: the next_cursor (older runs) or prev_cursor "
        "(newer runs) of a page; none: the first page.",
    ),
]
# Worker ids are what their operators chose: any printable text the column (128) holds.
WorkerFilter = Annotated[
    str | None,
    Query(max_length=128, pattern=r"^[^\x00-\x1f\x7f]*$", description="Only this worker's runs."),
]
