"""Frames between gateways: a 4-byte big-endian length, a msgpack map, then raw payload bytes.

Only an ``offer`` carries a payload (its ``size`` bytes follow the header unframed), so the
receiver reads them straight into the object's mapping: no buffer in between.
"""

from __future__ import annotations

import os
import socket
import struct
from typing import Any

from cdi.errors import ProtocolError
from cdi.protocol import pack, unpack

__all__ = ["LINK_TIMEOUT_S", "MAX_HEADER", "receive_header", "receive_into", "send_frame"]

MAX_HEADER = 64 << 10
_LENGTH = struct.Struct("!I")
_CHUNK = 4 << 20
# A payload that makes no progress for this long means the link is gone (a cable pulled, a
# peer frozen): TCP itself would wait for minutes. Each chunk of 4 MiB has this long.
LINK_TIMEOUT_S = float(os.environ.get("CDI_LINK_TIMEOUT_S", "10"))


def send_frame(
    sock: socket.socket, header: dict[str, Any], payload: memoryview | None = None
) -> None:
    """One header and, for an offer, its payload; ``OSError`` if the link fails."""
    body = pack(header)
    if payload is None or len(payload) <= 64 << 10:
        # One send for a small object: a second segment would cost the receiver a wake-up.
        sock.sendall(b"".join((_LENGTH.pack(len(body)), body, payload or b"")))
        return
    sock.sendall(_LENGTH.pack(len(body)) + body)
    sock.settimeout(LINK_TIMEOUT_S)
    try:
        for offset in range(0, len(payload), _CHUNK):
            sock.sendall(payload[offset : offset + _CHUNK])
    finally:
        sock.settimeout(None)


def receive_header(sock: socket.socket) -> dict[str, Any] | None:
    """The next header; ``None`` if the peer closed the link between frames."""
    head = _receive_exact(sock, _LENGTH.size, allow_eof=True)
    if head is None:
        return None
    (length,) = _LENGTH.unpack(head)
    if length > MAX_HEADER:
        raise ProtocolError(f"a gateway header of {length} bytes (the limit is {MAX_HEADER})")
    body = _receive_exact(sock, length, allow_eof=False)
    assert body is not None
    return unpack(body)


def receive_into(sock: socket.socket, view: memoryview) -> None:
    """Fill ``view`` from the link; ``ConnectionError`` if it ends first (a half object),
    ``TimeoutError`` if no byte comes for ``LINK_TIMEOUT_S``."""
    got, size = 0, len(view)
    sock.settimeout(LINK_TIMEOUT_S)
    try:
        while got < size:
            n = sock.recv_into(view[got:], size - got)
            if n == 0:
                raise ConnectionError(f"the link closed after {got} of {size} bytes")
            got += n
    finally:
        sock.settimeout(None)


def _receive_exact(sock: socket.socket, size: int, *, allow_eof: bool) -> bytes | None:
    buffer = bytearray(size)
    got = 0
    view = memoryview(buffer)
    while got < size:
        n = sock.recv_into(view[got:], size - got)
        if n == 0:
            if got == 0 and allow_eof:
                return None
            raise ConnectionError(f"the link closed inside a frame ({got} of {size} bytes)")
        got += n
    return bytes(buffer)
