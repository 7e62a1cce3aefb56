"""Frames over gRPC: each frame is one unary call ``/ar.Frames/Put``.

Detectors and the combinator are gRPC servers; the extractor and the detectors call them over
one channel per peer. The message is the frame message's bytes as they are (no protobuf
wrapper: a ``bytes`` field would only add its own copies), so this measures gRPC's own cost
of moving them. A call returns once the receiver has queued the frame. gRPC hands a server
an immutable ``bytes``, so a detector copies it into a buffer it can draw on; a call takes
``bytes``, so each sender copies its buffer into one.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent import futures

import grpc

from apps.ar.config import RunConfig
from apps.ar.links.served import Message, served_backend

__all__ = ["BACKEND"]

_METHOD = "/ar.Frames/Put"


def _options(config: RunConfig) -> list[tuple[str, int]]:
    limit = config.message_size + (1 << 20)
    return [("grpc.max_send_message_length", limit), ("grpc.max_receive_message_length", limit)]


class _FrameServer:
    """A gRPC server whose one method hands each request to ``accept`` (which may wait)."""

    def __init__(self, config: RunConfig, address: str, accept: Callable[[Message], None]) -> None:
        def put(request: bytes, context: grpc.ServicerContext) -> bytes:
            try:
                accept(request)
            except TimeoutError as exc:
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
            except ValueError as exc:  # not a frame message (workflows' InvalidVideo)
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            return b""

        handler = grpc.method_handlers_generic_handler(
            "ar.Frames", {"Put": grpc.unary_unary_rpc_method_handler(put)}
        )
        # More threads than calls in flight: a detector's one sender waits in ``accept``.
        pool = futures.ThreadPoolExecutor(max_workers=config.detectors + 2)
        self._server = grpc.server(pool, options=_options(config))
        self._server.add_generic_rpc_handlers((handler,))
        port = self._server.add_insecure_port(f"{address}:0")
        self._server.start()
        self.address = f"{address}:{port}"

    def close(self) -> None:
        self._server.stop(grace=None)


class _Caller:
    def __init__(self, address: str, config: RunConfig) -> None:
        self._channel = grpc.insecure_channel(address, options=_options(config))
        self._put = self._channel.unary_unary(_METHOD)
        self._timeout = config.timeout_s

    def put(self, message: memoryview) -> None:
        self._put(bytes(message), timeout=self._timeout)

    def close(self) -> None:
        self._channel.close()


BACKEND = served_backend("grpc", _FrameServer, _Caller)
