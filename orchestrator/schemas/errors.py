"""Error bodies: every error the API answers on purpose, and FastAPI's field problems."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from orchestrator.schemas.base import ResponseBody

__all__ = ["ErrorPublic", "FieldErrorPublic", "ValidationErrorPublic", "error_responses"]


class ErrorPublic(ResponseBody):
    """Every error the API answers on purpose (see ``orchestrator.controller.http_errors``)."""

    detail: str = Field(description="What went wrong and what to change.")
    code: str = Field(description="Stable error code, e.g. 'not_found', 'conflict'.")
    known: list[str] | None = Field(default=None, description="Valid names, with a 404.")
    problems: list[str] | None = Field(default=None, description="Every problem, with a 422.")


class FieldErrorPublic(ResponseBody):
    """One problem FastAPI found in a request's shape (a field, a parameter, the JSON)."""

    loc: list[str | int] = Field(description="Where: 'body', 'query', 'path', then names.")
    msg: str
    type: str
    input: Any = None
    ctx: dict[str, Any] | None = Field(
        default=None, description="e.g. 'error': why the JSON is refused."
    )


class ValidationErrorPublic(ResponseBody):
    """A request whose shape is wrong: every problem, where it is."""

    detail: list[FieldErrorPublic]


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` documenting the ``ErrorPublic`` body for ``statuses``; a 422 is
    either that or FastAPI's list of field problems (``ValidationErrorPublic``)."""
    return {
        status: {"model": ErrorPublic | ValidationErrorPublic if status == 422 else ErrorPublic}
        for status in statuses
    }
