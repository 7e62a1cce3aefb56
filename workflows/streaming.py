"""Streaming steps: what a task sees of its run's channels (``TaskContext.channels``).

A step with ``"channels": {"publish": [...], "subscribe": [...]}`` is a streaming step: it runs
while every step joined to it by channels runs, and passes items to them as it goes::

    @task(name="double", needs_image=False)
    def double(ctx: TaskContext) -> dict[str, Any]:
        out = ctx.channels.publish("doubled")
        count = 0
        for item in ctx.channels.subscribe("numbers"):  # until its publisher ends it
            out.send(item * 2)
            count += 1
        return {"count": count}                          # returning ends "doubled"

* ``publish(name)`` gives the ``Sender`` of a channel the step publishes: ``send(item)``
  delivers an item to every subscriber, waiting while the slowest has not read far enough
  (back-pressure); ``close()`` ends the stream (the worker does so once the task returns).
* ``subscribe(name)`` gives the ``Receiver`` of a channel it subscribes to: iterating it yields
  the items in order and stops at the end of the stream. A publisher that fails or is stopped
  before it ends the stream makes the receiver raise ``StreamBroken``: its subscribers fail
  with it, and so does the run.
* Items are bytes (received as ``bytes``), NumPy arrays (received read-only) or JSON values.

Channels are scoped to the run: two runs of one definition never see each other's items.
Every channel of a step is opened before the task function starts (all of its group's peers
have then joined), so a task may publish and subscribe in any order.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from typing import Any, Final, Protocol

import numpy as np

from workflows.errors import InvalidData, WorkflowsError

__all__ = [
    "BROKEN",
    "END",
    "Channels",
    "Receiver",
    "Sender",
    "StreamBroken",
    "decode_item",
    "encode_item",
]

# The first byte of every message on a streaming step's channel says what follows.
_BYTES: Final = b"B"
_JSON: Final = b"J"
_ARRAY: Final = b"A"
END: Final = b"E"  # the publisher ended the stream: nothing follows
BROKEN: Final = b"X"  # the publisher failed or was stopped before it ended the stream
_HEADER = struct.Struct("<I")  # an array's JSON header length


class StreamBroken(WorkflowsError):
    """A channel's publisher stopped before it ended its stream."""


class Sender(Protocol):
    def send(self, item: Any) -> None:
        """Deliver ``item`` (bytes, a NumPy array or a JSON value) to every subscriber."""

    def close(self) -> None:
        """End the stream: subscribers stop iterating once they have read every item."""


class Receiver(Protocol):
    def __iter__(self) -> Iterator[Any]:
        """The items, in order, until the end of the stream (``StreamBroken`` if it breaks)."""


class Channels(Protocol):
    def publish(self, name: str) -> Sender:
        """The sender of channel ``name``, which this step publishes."""

    def subscribe(self, name: str) -> Receiver:
        """The receiver of channel ``name``, which this step subscribes to."""


def encode_item(item: Any) -> list[bytes | memoryview]:
    """``item`` as the parts of one message (joined by the sender)."""
    if isinstance(item, bytes | bytearray | memoryview):
        return [_BYTES, memoryview(item).cast("B")]
    if isinstance(item, np.ndarray):
        if item.dtype.hasobject:
            raise InvalidData("an array of Python objects cannot go over a channel")
        array = np.ascontiguousarray(item)
        header = json.dumps({"dtype": array.dtype.str, "shape": list(array.shape)}).encode()
        return [_ARRAY, _HEADER.pack(len(header)), header, array.reshape(-1).view(np.uint8).data]
    try:
        return [_JSON, json.dumps(item, allow_nan=False).encode()]
    except (TypeError, ValueError) as exc:
        raise InvalidData(
            f"a channel carries bytes, NumPy arrays or JSON values, not {type(item).__name__}"
        ) from exc


def decode_item(message: bytes) -> Any:
    """The item a message (not ``END`` or ``BROKEN``) carries."""
    kind, body = message[:1], memoryview(message)[1:]
    if kind == _BYTES:
        return bytes(body)
    if kind == _JSON:
        return json.loads(bytes(body))
    if kind == _ARRAY:
        (length,) = _HEADER.unpack_from(body)
        header = json.loads(bytes(body[_HEADER.size : _HEADER.size + length]))
        data = body[_HEADER.size + length :]
        array = np.frombuffer(data, dtype=np.dtype(header["dtype"])).reshape(header["shape"])
        array.flags.writeable = False
        return array
    raise InvalidData(f"a channel message of unknown kind {kind!r}")
