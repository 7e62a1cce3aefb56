"""The protocol as ``cdi/PROTOCOL.md`` writes it down, and a raw connection that speaks it.

``SPEC`` is read from the document's operation table, so the conformance tests check the minions
against the text itself; ``Peer`` sends any bytes and collects replies with their fds, bypassing
the client library. ``compact`` and ``compact_reply`` lay out the compact form from the document's
tables, apart from the client's own code (``cdi/compact.py``).
"""

from __future__ import annotations

import array
import os
import re
import select
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack

PROTOCOL_MD = Path(__file__).resolve().parents[2] / "cdi" / "PROTOCOL.md"

_TYPES: dict[str, Any] = {
    "int": lambda v: type(v) is int,
    "str": lambda v: type(v) is str,
    "bool": lambda v: type(v) is bool,
    "float": lambda v: type(v) is float,
    "key": lambda v: type(v) is str,
    "cid": lambda v: type(v) is str,
    "[cid]": lambda v: type(v) is list and all(type(i) in (str, int) for i in v),
    "[int]": lambda v: type(v) is list and all(type(i) is int for i in v),
    "[str]": lambda v: type(v) is list and all(type(i) is str for i in v),
    "{…}": lambda v: type(v) is dict,
    "[{…}]": lambda v: type(v) is list and all(type(i) is dict for i in v),
}


@dataclass(frozen=True)
class Field:
    name: str
    type: str
    optional: bool

    def accepts(self, value: object) -> bool:
        check = _TYPES[self.type]
        return bool(check(value))


@dataclass(frozen=True)
class Operation:
    name: str
    request: tuple[Field, ...]
    reply: tuple[Field, ...]
    fd: str  # "yes", "no" or "unless have"


def _fields(cell: str) -> tuple[Field, ...]:
    fields = []
    for part in filter(None, (p.strip() for p in cell.split(", ") if p.strip())):
        name, _, kind = part.partition(": ")
        optional = name.endswith("?")
        assert kind in _TYPES, f"PROTOCOL.md: unknown type {kind!r} in {part!r}"
        fields.append(Field(name.rstrip("?"), kind, optional))
    return tuple(fields)


def read_spec(path: Path = PROTOCOL_MD) -> tuple[dict[str, Operation], dict[str, str]]:
    """The operation table and the error-code table of PROTOCOL.md."""
    text = path.read_text()
    table = text.split("<!-- operations:", 1)[1].split("\n\n", 1)[0]
    operations: dict[str, Operation] = {}
    for line in table.splitlines()[3:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        name, request, reply, fd = cells
        operations[name] = Operation(name, _fields(request), _fields(reply), fd)
    codes_table = text.split("## Error codes", 1)[1]
    codes = dict(re.findall(r"^\| `(\w+)` \| (.+) \|$", codes_table, re.MULTILINE))
    return operations, codes


SPEC, ERROR_CODES = read_spec()


def problems_with(op: str, reply: dict[str, Any], fd: bool) -> list[str]:
    """What in ``reply`` (to an ``op`` request) breaks the protocol; empty if nothing."""
    found = []
    if type(reply.get("id")) is not int:
        found.append(f"id {reply.get('id')!r} is not an integer")
    if reply.get("ok") is False:
        if reply.get("code") not in ERROR_CODES:
            found.append(f"unknown error code {reply.get('code')!r}")
        if type(reply.get("msg")) is not str or not reply["msg"]:
            found.append("an error without a message")
        if fd:
            found.append("an error carried an fd")
        return found
    if reply.get("ok") is not True:
        return [*found, f"ok is {reply.get('ok')!r}"]
    spec = SPEC[op]
    for field in spec.reply:
        if field.name not in reply:
            found.append(f"{op}: reply lacks {field.name}")
        elif not field.accepts(reply[field.name]):
            found.append(f"{op}: {field.name}={reply[field.name]!r} is not {field.type}")
    if spec.fd == "yes" and not fd:
        found.append(f"{op}: reply without its fd")
    if spec.fd == "no" and fd:
        found.append(f"{op}: reply with an fd")
    return found


COMPACT_MAGIC = b"\xc1"
_COMPACT_OPS = {"access": 1, "transfer": 2}


def compact(
    op: str,
    request_id: int,
    key: str,
    *,
    to: str = "",
    via: str = "",
    wait: bool = True,
    have: int | None = None,
) -> bytes:
    """A request in the compact form, laid out as PROTOCOL.md's table says."""
    flags = (0 if wait else 1) | (0 if have is None else 2)
    parts = [text.encode() for text in (key, to, via)]
    head = bytes([0xC1, 1, _COMPACT_OPS[op], flags])
    head += request_id.to_bytes(8, "little", signed=True)
    head += (have or 0).to_bytes(8, "little", signed=True)
    head += b"".join(len(part).to_bytes(2, "little") for part in parts)
    return head + b"".join(parts)


def compact_reply(data: bytes) -> dict[str, Any]:
    """A compact reply as the map it stands for; ``AssertionError`` if it breaks the layout."""
    assert data[1] == 1, f"compact form version {data[1]}"
    kind, flags = data[2], data[3]
    reply: dict[str, Any] = {"id": int.from_bytes(data[4:12], "little", signed=True), "ok": True}
    words = [int.from_bytes(data[at : at + 8], "little") for at in range(12, len(data) - 7, 8)]
    if kind == 1:
        assert len(data) == 44, f"a compact grant of {len(data)} bytes"
        reply.update(zip(("size", "capacity", "generation", "segment"), words, strict=True))
        reply["isolation"] = "strict" if flags & 1 else "cooperative"
        return reply
    assert kind == 2, f"compact reply kind {kind}"
    length = int.from_bytes(data[20:22], "little")
    assert len(data) == 22 + length, "a compact transfer reply of the wrong length"
    reply.update(generation=words[0], keep_mapping=bool(flags & 1), to=data[22:].decode())
    return reply


class Peer:
    """One raw connection to a minion: send anything, read replies with their fds."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock.connect(path)
        self._ids = iter(range(1, 1 << 62))
        self.compact_replies = 0  # replies that came in the compact form

    def send(self, message: dict[str, Any] | bytes) -> None:
        data = message if isinstance(message, bytes) else msgpack.packb(message)
        self.sock.send(data)

    def receive(self, timeout: float = 10.0) -> tuple[dict[str, Any], int | None]:
        """The next reply and its fd (the caller closes it); raises on timeout or hang-up."""
        if not select.select([self.sock], [], [], timeout)[0]:
            raise TimeoutError("no reply")
        data, anc, _flags, _ = self.sock.recvmsg(1 << 20, socket.CMSG_SPACE(16))
        if not data:
            raise ConnectionError("the minion closed the connection")
        fds = array.array("i")
        for _level, _kind, blob in anc:
            fds.frombytes(blob[: len(blob) - len(blob) % fds.itemsize])
        for extra in fds[1:]:
            os.close(extra)
        if data[:1] == COMPACT_MAGIC:
            self.compact_replies += 1
            reply = compact_reply(data)
        else:
            reply = msgpack.unpackb(data, raw=False)
        assert isinstance(reply, dict), reply
        return reply, (fds[0] if fds else None)

    def pending(self) -> list[tuple[dict[str, Any], int | None]]:
        """Replies already waiting (grants sent to us by someone else's request)."""
        got = []
        while select.select([self.sock], [], [], 0)[0]:
            got.append(self.receive(0))
        return got

    def call(self, op: str, **fields: Any) -> tuple[dict[str, Any], bool]:
        """Send ``op`` with a fresh id and return its reply and whether an fd came (closed)."""
        request_id = next(self._ids)
        self.send({"op": op, "id": request_id, **fields})
        deadline = time.monotonic() + 10
        while True:
            reply, fd = self.receive(max(0.0, deadline - time.monotonic()))
            if fd is not None:
                os.close(fd)
            if reply.get("id") == request_id:
                return reply, fd is not None

    def close(self) -> None:
        self.sock.close()
