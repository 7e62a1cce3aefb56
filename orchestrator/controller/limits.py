"""Refuse request bodies over a size limit before anything buffers them.

A declared ``Content-Length`` over the limit is refused at once; a chunked body is counted as
it streams and refused as soon as it crosses the limit. Pure ASGI, so it sees the body before
FastAPI reads it into memory. Paths that take files (an image upload) have limits of their own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from orchestrator.controller.http_errors import error_response
from orchestrator.errors import RequestTooLarge

__all__ = ["MAX_BODY_BYTES", "BodySizeLimit", "PathLimit"]

MAX_BODY_BYTES: Final = 1 << 20  # 1 MiB: definitions and inputs are small; images go by S3 URI


class _Exceeded(Exception):
    """Raised from ``receive`` to stop the app reading a body that is too large."""


@dataclass(frozen=True)
class PathLimit:
    """The body limit of one path, and what a refusal says about it."""

    max_bytes: int
    what: str
    advice: str


class BodySizeLimit:
    """ASGI middleware answering 413 to bodies over ``max_bytes`` (or over the limit of their
    path in ``paths``)."""

    def __init__(
        self,
        app: ASGIApp,
        max_bytes: int = MAX_BODY_BYTES,
        paths: Mapping[str, PathLimit] | None = None,
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.paths = dict(paths or {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        special = self.paths.get(scope["path"])
        limit = special.max_bytes if special else self.max_bytes
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await self._refuse(scope, receive, send, special)
            return

        seen = 0
        exceeded = False
        started = False

        async def counting_receive() -> Message:
            nonlocal seen, exceeded
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    exceeded = True
                    raise _Exceeded
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if exceeded:  # the app's answer to the aborted read (a 400 or 500) is dropped
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counting_receive, guarded_send)
        except Exception:
            if not exceeded:
                raise
        if exceeded and not started:
            await self._refuse(scope, receive, send, special)

    async def _refuse(
        self, scope: Scope, receive: Receive, send: Send, special: PathLimit | None
    ) -> None:
        error = (
            RequestTooLarge(special.max_bytes, what=special.what, advice=special.advice)
            if special
            else RequestTooLarge(self.max_bytes)
        )
        response = error_response(error)
        response.headers["Connection"] = "close"  # the rest of the body is not read
        await response(scope, receive, send)
