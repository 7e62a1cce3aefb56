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
# A request: magic, version, op, flags, id, have, the lengths of key, to and via. The first
# bytes fixed in advance for each operation: one pack, no field checked twice.
_TRANSFER_HEAD = struct.Struct("<4sq8xHHH")  # (magic, version, op 2, flags 0), id, lengths
_ACCESS_HEAD = struct.Struct("<3sBqqH4x")  # (magic, version, op 1), flags, id, have, key length
_GRANT = struct.Struct("<4xqQQQQ")  # id, size, capacity, generation, segment
_TRANSFERRED = struct.Struct("<4xqQH")  # id, generation, the length of ``to``
_TRANSFER_START = bytes([MAGIC, VERSION, 2, 0])
_ACCESS_START = bytes([MAGIC, VERSION, 1])
_GRANTED, _MOVED = 1, 2  # reply kinds
_NO_WAIT, _HAVE = 1, 2  # an access's flags
_LONGEST = 0xFFFF  # a string's length is a u16
_I64 = range(-(1 << 63), 1 << 63)


def encode_request(op: str, request_id: int, args: dict[str, Any]) -> bytes | None:
    """``op`` with ``args`` in the compact form; ``None`` when the form cannot carry them (any
    other operation, a field it has no room for, a value of another type): a map then.
    ``ValueError`` for a string that is not UTF-8, as MessagePack's packer raises."""
    if request_id not in _I64:
        return None
    if op == "transfer":
        key, to, via = args.get("key"), args.get("to"), args.get("via", "")
        if len(args) != 2 + ("via" in args) or not (type(key) is type(to) is type(via) is str):
            return None
        k, t, v = key.encode(), to.encode(), via.encode()
        if len(k) > _LONGEST or len(t) > _LONGEST or len(v) > _LONGEST:
            return None
        return _TRANSFER_HEAD.pack(_TRANSFER_START, request_id, len(k), len(t), len(v)) + k + t + v
    if op == "access":
        key, wait, have = args.get("key"), args.get("wait", True), args.get("have")
        if len(args) != 1 + ("wait" in args) + ("have" in args):
            return None
        if type(key) is not str or type(wait) is not bool:
            return None
        flags = 0 if wait else _NO_WAIT
        if have is None:
            have = 0
        elif type(have) is int and have in _I64:
            flags |= _HAVE
        else:
            return None
        k = key.encode()
        return (
            None
            if len(k) > _LONGEST
            else _ACCESS_HEAD.pack(_ACCESS_START, flags, request_id, have, len(k)) + k
        )
    return None


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
