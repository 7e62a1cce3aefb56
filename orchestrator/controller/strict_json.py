"""Request bodies parsed as strict JSON, so no value reaches Postgres that it cannot store.

Python's ``json`` accepts ``NaN`` and ``Infinity`` (not JSON), turns ``1e999`` into an infinity,
keeps ``\\u0000`` and lone surrogates (``\\ud800``) in strings, and gives up on deep nesting
with a ``RecursionError``. Postgres refuses each of them (a NUL in text, an unencodable
character, a non-finite number in ``jsonb``), and the API answered 500. Here every body is
parsed once, refused with a reason where it holds such a value, and FastAPI turns the refusal
into a 422 (``json_invalid``, the reason in ``ctx.error``).

Integers must fit in 64 bits (Postgres ``bigint``; a JavaScript client loses digits past 2**53
anyway) and nesting stops at ``MAX_DEPTH`` levels.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Coroutine
from typing import Any, Final

from fastapi import Request, Response
from fastapi.routing import APIRoute

__all__ = ["MAX_DEPTH", "StrictJsonRoute", "strict_loads", "text_problem"]

MAX_DEPTH: Final = 64
_INT_BOUND: Final = 2**63


def text_problem(text: str) -> str | None:
    """Why Postgres cannot store ``text``, or ``None``."""
    if "\x00" in text:
        return "text may not hold a NUL character (\\u0000)"
    try:
        text.encode()
    except UnicodeEncodeError:
        return "text may not hold a lone surrogate (\\ud800-\\udfff without its pair)"
    return None


def _constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number; send a finite number or null")


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is not a finite number (too large for a double)")
    return value


def _int(text: str) -> int:
    if len(text) > 21:  # past 64 bits whatever the digits; cheaper than converting
        raise ValueError(f"the integer {text[:24]}... does not fit in 64 bits")
    value = int(text)
    if not -_INT_BOUND <= value < _INT_BOUND:
        raise ValueError(f"the integer {text} does not fit in 64 bits")
    return value


def _walk(value: Any) -> str | None:
    """The first problem of a parsed document: a string Postgres cannot store, or nesting
    deeper than ``MAX_DEPTH``. Iterative: the depth is what is being checked."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            if (problem := text_problem(item)) is not None:
                return problem
        elif isinstance(item, dict | list):
            if depth > MAX_DEPTH:
                return f"the document is nested deeper than {MAX_DEPTH} levels"
            if isinstance(item, dict):
                stack.extend((k, depth) for k in item)
                stack.extend((v, depth + 1) for v in item.values())
            else:
                stack.extend((v, depth + 1) for v in item)
    return None


def strict_loads(body: bytes) -> Any:
    """``body`` as JSON; ``json.JSONDecodeError`` (what FastAPI answers with a 422) saying
    what to change when it is not strict JSON a database can hold."""
    try:
        text = body.decode()
    except UnicodeDecodeError as exc:
        raise json.JSONDecodeError("the body is not UTF-8 text", "", exc.start) from None
    try:
        value = json.loads(text, parse_constant=_constant, parse_float=_float, parse_int=_int)
    except json.JSONDecodeError:
        raise
    except RecursionError:
        raise json.JSONDecodeError(
            f"the document is nested deeper than {MAX_DEPTH} levels", text, 0
        ) from None
    except ValueError as exc:
        raise json.JSONDecodeError(str(exc), text, 0) from None
    if (problem := _walk(value)) is not None:
        raise json.JSONDecodeError(problem, text, 0)
    return value


class _StrictRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = strict_loads(await self.body())
        return self._json


class StrictJsonRoute(APIRoute):
    """A route whose JSON body is parsed by ``strict_loads``."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict(request: Request) -> Response:
            return await handler(_StrictRequest(request.scope, request.receive))

        return strict
