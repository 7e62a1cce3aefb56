"""Refuse request bodies over a size limit before anything buffers them.

A declared ``Content-Length`` over the limit is refused at once; a chunked body is counted as
it streams and refused as soon as it crosses the limit. Pure ASGI, so it sees the body before
FastAPI reads it into memory.
"""

from __future__ import annotations

from typing import Final

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from orchestrator.controller.http_errors import error_response
from orchestrator.errors import RequestTooLarge

__all__ = ["MAX_BODY_BYTES", "BodySizeLimit"]

MAX_BODY_BYTES: Final = 1 << 20  # 1 MiB: definitions and inputs are small; images go by S3 URI


class _Exceeded(Exception):
    """Raised from ``receive`` to stop the app reading a body that is too large."""


class BodySizeLimit:
    """ASGI middleware answering 413 to bodies over ``max_bytes``."""

    def __init__(self, app: ASGIApp, max_bytes: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(scope, receive, send)
            return

        seen = 0
        exceeded = False
        started = False

        async def counting_receive() -> Message:
            nonlocal seen, exceeded
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
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
            await self._refuse(scope, receive, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = error_response(RequestTooLarge(self.max_bytes))
        response.headers["Connection"] = "close"  # the rest of the body is not read
        await response(scope, receive, send)
