"""The minion's wire protocol (``cdi/PROTOCOL.md``, which is binding) and the validation both
ends share.

Transport: a Unix ``SOCK_SEQPACKET`` socket, so every message keeps its boundaries and a file
descriptor rides with the message it belongs to (``SCM_RIGHTS``). Each message is one msgpack map,
or, for ``access`` and ``transfer``, one message in the compact form (``cdi.compact``).

Request  ``{"op": <Op>, "id": <int>, ...arguments}``
Reply    ``{"id": <int>, "ok": true, ...results}`` or ``{"id": <int>, "ok": false, "code": <str>,
"msg": <str>}``; a reply that grants memory carries exactly one fd.

Replies come in request order except for ``access``, whose reply (the grant) is deferred until the
caller owns the object; a client therefore matches replies by ``id``.
"""

from __future__ import annotations

import array
import mmap
import os
import re
import socket
from collections.abc import Callable
from enum import StrEnum
from typing import Any

import msgpack

from cdi import compact
from cdi.errors import InvalidArgument, ProtocolError

__all__ = [
    "DONTWAIT",
    "MAX_KEY_LENGTH",
    "MAX_MESSAGE",
    "Isolation",
    "Op",
    "Receiver",
    "check_container_id",
    "check_container_ids",
    "check_key",
    "check_segment_ids",
    "check_size",
    "pack",
    "packer",
    "read_reply",
    "receive_request",
    "size_class",
    "unpack",
]

# Largest message either side sends: requests are small; a `list` of a busy host is not.
MAX_MESSAGE = 1 << 20
MAX_KEY_LENGTH = 256
MAX_OFFERED_SEGMENTS = 64  # segment ids a create may name as already mapped by the caller
MAX_READERS = 64  # containers one share may name
PAGE = mmap.PAGESIZE

_NAME = re.compile(r"[A-Za-z0-9_.:/@+=-]+")  # whole string: fullmatch (``$`` allows a "\n")

# Plain ints: the socket module's flags are IntFlag members, and one `|` or `&` on them runs
# enum code, on every message.
DONTWAIT = int(socket.MSG_DONTWAIT)
_TRUNC = int(socket.MSG_TRUNC)
_TRUNCATED = int(socket.MSG_TRUNC | socket.MSG_CTRUNC)
_SOL_SOCKET = int(socket.SOL_SOCKET)
_SCM_RIGHTS = int(socket.SCM_RIGHTS)


class Op(StrEnum):
    REGISTER = "register"
    CREATE = "create"
    USE = "use"
    COPY = "copy"
    ACCESS = "access"
    CANCEL = "cancel"
    TRANSFER = "transfer"
    RESIZE = "resize"
    DESTROY = "destroy"
    SET_RECOVERY = "set_recovery"
    SHARE = "share"
    READ = "read"
    RELEASE = "release"
    STAT = "stat"
    LIST = "list"


class Isolation(StrEnum):
    """How hard a transfer revokes the former owner's access.

    ``cooperative``: the client library unmaps on transfer; zero-copy.
    ``strict``: the minion copies into a fresh segment and truncates the old one, so a former
    owner that kept a mapping faults on its next touch; costs one copy per transfer.
    """

    COOPERATIVE = "cooperative"
    STRICT = "strict"


_valid_names: set[str] = set()  # names that passed once: a hot path checks a name per call


def _check_name(value: object, what: str) -> str:
    if type(value) is str and value in _valid_names:
        return value
    if isinstance(value, int) and not isinstance(value, bool) and what == "container id":
        value = str(value)  # the paper's container ids are integers; accept them as names
    if not isinstance(value, str):
        raise InvalidArgument(f"{what} must be a string, got {type(value).__name__}")
    if not value:
        raise InvalidArgument(f"{what} must not be empty")
    if len(value) > MAX_KEY_LENGTH:
        raise InvalidArgument(
            f"{what} is {len(value)} characters long; the limit is {MAX_KEY_LENGTH}"
        )
    if not _NAME.fullmatch(value):
        raise InvalidArgument(
            f"{what} {value!r} has characters outside letters, digits and _ . : / @ + = -"
        )
    if len(_valid_names) >= 4096:
        _valid_names.clear()
    _valid_names.add(value)
    return value


def check_key(key: object) -> str:
    """Return ``key`` if it is a valid object key, else raise ``InvalidArgument``."""
    return _check_name(key, "key")


def check_container_id(container_id: object) -> str:
    """Return the container id as a string (integers are accepted), else raise."""
    return _check_name(container_id, "container id")


def check_container_ids(value: object) -> list[str]:
    """The container ids a ``share`` names: a list of 1 to ``MAX_READERS`` ids."""
    if not isinstance(value, list) or not 0 < len(value) <= MAX_READERS:
        raise InvalidArgument(f"readers must be a list of 1 to {MAX_READERS} container ids")
    return [check_container_id(item) for item in value]


def check_size(size: object, limit: int) -> int:
    """Return ``size`` if it is an int in ``[0, limit]``, else raise ``InvalidArgument``."""
    if not isinstance(size, int) or isinstance(size, bool):
        raise InvalidArgument(f"size must be an integer number of bytes, got {type(size).__name__}")
    if size < 0:
        raise InvalidArgument(f"size must not be negative, got {size}")
    if size > limit:
        raise InvalidArgument(
            f"size {size} bytes exceeds this minion's object limit of {limit} bytes"
        )
    return size


# The integers MessagePack carries: a client cannot even send one outside them.
_WIRE_INTS = range(-(1 << 63), 1 << 64)


def check_sendable_size(size: object, limit: int | None) -> None:
    """Refuse, in the minion's own words, a size no message can carry (an integer beyond 64
    bits); the minion judges every other size."""
    if type(size) is int and size not in _WIRE_INTS:
        check_size(size, _WIRE_INTS.stop - 1 if limit is None else limit)


def check_segment_ids(value: object) -> frozenset[int]:
    """The segment ids a ``create`` names as mapped by the caller (``have``); empty if absent."""
    if value is None:
        return frozenset()
    if (
        not isinstance(value, list)
        or len(value) > MAX_OFFERED_SEGMENTS
        or not all(type(i) is int for i in value)
    ):
        raise InvalidArgument(
            f"have must be a list of at most {MAX_OFFERED_SEGMENTS} segment ids (integers)"
        )
    return frozenset(value)


def size_class(size: int) -> int:
    """Round ``size`` up to its segment class: whole pages, then 4 steps per power of two (<= 25%
    waste). Clients use it too, to name the segments they hold of the class a create needs."""
    pages = max(1, -(-size // PAGE))
    if pages <= 4:
        return pages * PAGE
    top = 1 << (pages - 1).bit_length()  # next power of two >= pages
    step = top // 8  # classes between top/2 and top: 5/8, 6/8, 7/8, 8/8 of top
    return (-(-pages // step) * step) * PAGE


class Receiver:
    """Receives messages (and at most one fd) into one reused buffer.

    ``recvmsg(1 MiB)`` allocates a fresh megabyte per call; reusing a buffer does not.
    The buffer is an anonymous mapping, not a ``bytearray`` (which zeroes, so holds, every
    page): only the pages messages reach become resident, a few KB for most clients.
    """

    _ANC = socket.CMSG_SPACE(array.array("i").itemsize)

    def __init__(self) -> None:
        self._buf = mmap.mmap(-1, MAX_MESSAGE)
        self._view = memoryview(self._buf)

    def receive(
        self, sock: socket.socket, flags: int = 0
    ) -> tuple[dict[str, Any] | None, int | None]:
        """One message and its fd; ``(None, None)`` when the peer hung up.

        ``flags=MSG_DONTWAIT`` polls without touching the socket's blocking mode (changing the
        mode costs two ``fcntl`` calls on every switch)."""
        nbytes, ancdata, msg_flags, _ = sock.recvmsg_into([self._view], self._ANC, flags)
        fd: int | None = None
        for level, kind, data in ancdata:
            if level == _SOL_SOCKET and kind == _SCM_RIGHTS:
                fds = array.array("i")
                fds.frombytes(data[: len(data) - (len(data) % fds.itemsize)])
                for extra in fds[1:]:
                    os.close(extra)
                fd = fds[0] if fds else None
        if nbytes == 0:
            if fd is not None:
                os.close(fd)
            return None, None
        if msg_flags & _TRUNCATED:
            if fd is not None:
                os.close(fd)
            raise ProtocolError(f"message larger than {MAX_MESSAGE} bytes")
        return read_reply(self._view[:nbytes], fd), fd


def read_reply(message: memoryview | bytes, fd: int | None) -> dict[str, Any]:
    """A reply in either form; an undecodable one raises ``ProtocolError`` with ``fd`` closed."""
    try:
        if message[0] == compact.MAGIC:
            return compact.decode_reply(memoryview(message))
        return unpack(message)
    except ProtocolError:
        if fd is not None:
            os.close(fd)
        raise


def receive_request(sock: socket.socket, view: memoryview) -> dict[str, Any] | None:
    """One request into ``view`` (the minion's side); ``None`` when the peer hung up.

    Clients never send memory: a plain ``recv`` takes no ancillary buffer, so the kernel drops
    any fd a client attached (it is never installed here) and Python builds no ancdata list."""
    nbytes = sock.recv_into(view, 0, _TRUNC)  # MSG_TRUNC: the real length, to catch truncation
    if nbytes == 0:
        return None
    if nbytes > len(view):
        raise ProtocolError(f"message larger than {len(view)} bytes")
    return unpack(view[:nbytes])


def pack(message: dict[str, Any]) -> bytes:
    return msgpack.packb(message, use_bin_type=True)


def packer() -> Callable[[dict[str, Any]], bytes]:
    """A reusable ``pack`` for one thread at a time, cheaper per message than ``pack``, which
    builds a new packer per call."""
    return msgpack.Packer(use_bin_type=True).pack


def unpack(data: bytes | memoryview) -> dict[str, Any]:
    try:
        message = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise ProtocolError(f"undecodable message: {exc}") from exc
    if not isinstance(message, dict):
        raise ProtocolError("a message must be a map")
    return message
