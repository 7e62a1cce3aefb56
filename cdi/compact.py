"""The compact form of the minion protocol's hot operations (``cdi/PROTOCOL.md``, *Compact
form*): ``access`` and ``transfer``, the two requests on every hand-off's path, as a fixed
binary header instead of a MessagePack map, and their success replies likewise. Neither end
builds or parses a map for them; errors are still maps.

A minion that takes the form says so in ``register``'s reply (``compact``); ``cdi.protocol``'s
``Receiver`` reads both forms, telling them apart by the first byte.
"""

from __future__ import annotations

import struct
from typing import Any

from cdi.errors import ProtocolError

__all__ = ["MAGIC", "VERSION", "decode_reply", "encode_request"]

VERSION = 1
MAGIC = 0xC1  # a byte MessagePack never uses
_REQUEST = struct.Struct("<BBBBqqHHH")  # magic, version, op, flags, id, have, 3 lengths
_GRANT = struct.Struct("<4xqQQQQ")  # id, size, capacity, generation, segment
_TRANSFERRED = struct.Struct("<4xqQH")  # id, generation, the length of ``to``
_ACCESS, _TRANSFER = 1, 2  # request operations
_GRANTED, _MOVED = 1, 2  # reply kinds
_NO_WAIT, _HAVE = 1, 2  # an access's flags
_LONGEST = 0xFFFF  # a string's length is a u16
_I64 = range(-(1 << 63), 1 << 63)


def encode_request(op: str, request_id: int, args: dict[str, Any]) -> bytes | None:
    """``op`` with ``args`` in the compact form; ``None`` when the form cannot carry them (any
    other operation, a field it has no room for, a value of another type): a map then.
    ``ValueError`` for a string that is not UTF-8, as MessagePack's packer raises."""
    if op == "transfer":
        key, to, via = args.get("key"), args.get("to"), args.get("via", "")
        if len(args) != 2 + ("via" in args) or not (type(key) is type(to) is type(via) is str):
            return None
        parts = (key.encode(), to.encode(), via.encode())
        code, flags, have = _TRANSFER, 0, 0
    elif op == "access":
        key, wait, offered = args.get("key"), args.get("wait", True), args.get("have")
        if len(args) != 1 + ("wait" in args) + ("have" in args):
            return None
        if type(key) is not str or type(wait) is not bool:
            return None
        code, flags, have = _ACCESS, (0 if wait else _NO_WAIT), 0
        if type(offered) is int and offered in _I64:
            flags, have = flags | _HAVE, offered
        elif offered is not None:
            return None
        parts = (key.encode(), b"", b"")
    else:
        return None
    k, t, v = parts
    if max(len(k), len(t), len(v)) > _LONGEST or request_id not in _I64:
        return None
    header = _REQUEST.pack(MAGIC, VERSION, code, flags, request_id, have, len(k), len(t), len(v))
    return header + k + t + v


def decode_reply(view: memoryview) -> dict[str, Any]:
    """A compact reply (the whole message) as the map it stands for."""
    size = len(view)
    if size >= 4 and view[1] == VERSION:
        kind, flags = view[2], view[3]
        if kind == _GRANTED and size == _GRANT.size:
            request_id, nbytes, capacity, generation, segment = _GRANT.unpack_from(view)
            return {
                "id": request_id, "ok": True, "size": nbytes, "capacity": capacity,
                "generation": generation, "isolation": "strict" if flags & 1 else "cooperative",
                "segment": segment,
            }  # fmt: skip
        if kind == _MOVED and size >= _TRANSFERRED.size:
            request_id, generation, length = _TRANSFERRED.unpack_from(view)
            if _TRANSFERRED.size + length == size:
                try:
                    to = str(view[_TRANSFERRED.size :], "utf-8")
                except UnicodeDecodeError:
                    pass
                else:
                    return {
                        "id": request_id, "ok": True, "generation": generation,
                        "keep_mapping": bool(flags & 1), "to": to,
                    }  # fmt: skip
    raise ProtocolError("undecodable compact reply")
