"""Reading a request's fields as ``cdi/PROTOCOL.md`` types them (nil counts as absent)."""

from __future__ import annotations

from typing import Any

from cdi.errors import InvalidArgument, ProtocolError

__all__ = ["Reply", "optional_bool", "optional_int", "waiting_id"]

Reply = tuple[dict[str, Any], int | None] | None
"""What an operation answers: a body and at most one fd; ``None`` defers the reply."""


def optional_bool(request: dict[str, Any], name: str, default: bool) -> bool:
    value = request.get(name)
    if value is None:
        return default
    if type(value) is not bool:
        raise InvalidArgument(f"{name} must be true or false, got {value!r}")
    return value


def optional_int(request: dict[str, Any], name: str) -> int | None:
    value = request.get(name)
    if value is not None and type(value) is not int:
        raise InvalidArgument(f"{name} must be an integer, got {type(value).__name__}")
    return value


def waiting_id(request: dict[str, Any]) -> int:
    """The id of a request that may be deferred: it must carry one to be answered by."""
    request_id = request.get("id")
    if request_id is None:
        raise ProtocolError("a request that waits needs a request id to answer it by")
    assert type(request_id) is int  # the loop refuses any other id
    return request_id
