"""Frames over REST: each frame is the body of an HTTP ``POST /frames``.

Detectors and the combinator are HTTP servers (uvicorn, the server cdiflow's API runs on, with
a bare ASGI app: no framework routing between the body and the queue); the extractor and the
detectors are clients (``http.client``, one keep-alive connection per peer). A server reads a
body into a buffer of its own (the body arrives in the server's chunks: one copy), queues it
and answers ``204`` once it is queued (``apps.ar.links.served``), so a sender waits only while
the receiver is full. A detector draws on that buffer and posts it on.
"""

from __future__ import annotations

import asyncio
import http.client
import socket
import threading
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import uvicorn

from apps.ar.config import RunConfig
from apps.ar.links.served import served_backend

__all__ = ["BACKEND"]

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
_PATH = "/frames"


class _FrameServer:
    """An HTTP server in a thread of its own that hands each ``POST /frames`` body to
    ``accept`` (which may wait, holding the answer back)."""

    def __init__(
        self, config: RunConfig, address: str, accept: Callable[[bytearray], None]
    ) -> None:
        self._size = config.message_size
        self._accept = accept
        self._socket = socket.create_server((address, 0))
        host, port = self._socket.getsockname()[:2]
        self.address = f"{host}:{port}"
        settings = uvicorn.Config(
            self._app, log_level="warning", access_log=False, lifespan="off", interface="asgi3"
        )
        self._server = uvicorn.Server(settings)
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._server.serve(sockets=[self._socket])),
            name="rest-server",
            daemon=True,
        )
        self._thread.start()

    async def _app(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        if scope["method"] != "POST" or scope["path"] != _PATH:
            await _answer(send, 404, b"POST frames to /frames")
            return
        body = bytearray(self._size)
        filled = 0
        more = True
        while more:
            message = await receive()
            chunk = message.get("body", b"")
            if filled + len(chunk) > self._size:
                await _answer(send, 413, b"a frame message is %d bytes" % self._size)
                return
            body[filled : filled + len(chunk)] = chunk
            filled += len(chunk)
            more = message.get("more_body", False)
        if filled != self._size:
            await _answer(send, 400, b"a frame message is %d bytes" % self._size)
            return
        try:
            await asyncio.to_thread(self._accept, body)
        except TimeoutError as exc:
            await _answer(send, 503, str(exc).encode())
            return
        except ValueError as exc:  # not a frame message (workflows' InvalidVideo)
            await _answer(send, 400, str(exc).encode())
            return
        await _answer(send, 204, b"")

    def close(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=5)
        self._socket.close()


async def _answer(send: Send, status: int, body: bytes) -> None:
    headers = [(b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class _Poster:
    """A keep-alive client that posts frame messages to one server."""

    def __init__(self, address: str, config: RunConfig) -> None:
        host, port = address.rsplit(":", 1)
        self._conn = http.client.HTTPConnection(host, int(port), timeout=config.timeout_s)
        self._where = address

    def put(self, body: memoryview) -> None:
        headers = {"Content-Type": "application/octet-stream"}
        self._conn.request("POST", _PATH, body=body, headers=headers)
        response = self._conn.getresponse()
        detail = response.read()
        if response.status != 204:
            raise ConnectionError(
                f"POST {_PATH} to {self._where} answered {response.status}: {detail!r}"
            )

    def close(self) -> None:
        self._conn.close()


BACKEND = served_backend("rest", _FrameServer, _Poster)
