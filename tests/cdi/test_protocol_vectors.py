"""Recorded protocol vectors: a long script of requests on three connections and the replies
every connection received, replayed against the minion.

``test_protocol.py`` checks the minion against ``cdi/PROTOCOL.md`` one rule at a time; this
catches a change in the state a long sequence of requests builds up, which no single rule
shows: which grants reach whom and when, the generations, the segments the pool hands out,
what ``stat`` and ``list`` say. Compared: for every reply on every connection, ``ok``,
``code``, the fields and their values, and whether an fd came; not the message text, the
minion's pid or the timestamps. Every reply is also checked against the document.

The vectors (``vectors/protocol_script.jsonl``) were recorded from two independent minions,
in Python and in Rust, which gave the same replies to every step. A deliberate change of the
protocol re-records them (``CDI_RECORD_VECTORS=1``, on a minion that implements the change) and
the diff is reviewed with the change to ``cdi/PROTOCOL.md``; anything else that changes them is
a regression.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cdi.conftest import MinionProcess, start_minion, stop_minion
from tests.cdi.test_protocol import LIMITS, random_message
from tests.cdi.wire import Peer, compact, problems_with

VECTORS = Path(__file__).with_name("vectors") / "protocol_script.jsonl"
RECORD = "CDI_RECORD_VECTORS"
VOLATILE = ("msg", "minion_pid", "store", "created_at", "updated_at")

Step = tuple[int, dict[str, Any] | None]  # (connection, request; None: hang up and reconnect)


@pytest.fixture
def minion(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MinionProcess]:
    """A new minion under the limits the vectors were recorded with (host name ``h``): segment
    ids count up for a minion's life, so each replay needs its own."""
    running = start_minion(tmp_path_factory.mktemp("vectors"), "--host", "h", *LIMITS)
    try:
        yield running
    finally:
        stop_minion(running)


# ------------------------------------------------------------------ the file's encoding
def _encode(value: Any) -> Any:
    """JSON for a request: bytes as ``{"$bytes": hex}`` (JSON has no bytes)."""
    if isinstance(value, bytes):
        return {"$bytes": value.hex()}
    if isinstance(value, dict):
        return {k: _encode(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_encode(v) for v in value]
    return value


def _decode(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {"$bytes"}:
            return bytes.fromhex(value["$bytes"])
        return {k: _decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


def _plain(value: Any) -> Any:
    """What ``value`` reads as after a trip through JSON (tuples become lists)."""
    return json.loads(json.dumps(value))


def normal(reply: dict[str, Any], fd: int | None) -> list[Any]:
    """A reply as compared: its fields but the volatile ones, sorted, and whether an fd came."""
    if fd is not None:
        os.close(fd)
    fields = {k: v for k, v in reply.items() if k not in VOLATILE}
    if isinstance(fields.get("objects"), list):
        fields["objects"] = [
            {k: v for k, v in o.items() if k not in VOLATILE} for o in fields["objects"]
        ]
    plain: list[Any] = _plain([sorted(fields.items(), key=lambda kv: kv[0]), fd is not None])
    return plain


# ------------------------------------------------------------------ replaying a script
def as_compact(message: dict[str, Any]) -> bytes | None:
    """``message`` in the compact form if it is an ``access`` or ``transfer`` that form can
    carry; fields the operation does not name, and nil ones, are dropped (the minion ignores
    them in a map)."""
    op = message.get("op")
    names = {"access": ("wait", "have"), "transfer": ("to", "via")}.get(op)  # type: ignore[arg-type]
    if names is None:
        return None
    fields = {k: message[k] for k in ("id", "key", *names) if message.get(k) is not None}
    key, request_id = fields.get("key"), fields.get("id")
    if type(key) is not str or type(request_id) is not int or not -(2**63) <= request_id < 2**63:
        return None
    if op == "access":
        wait, have = fields.get("wait", True), fields.get("have")
        if type(wait) is not bool or not (
            have is None or (type(have) is int and -(2**63) <= have < 2**63)
        ):
            return None
        return compact("access", request_id, key, wait=wait, have=have)
    to, via = fields.get("to"), fields.get("via")
    if type(to) is not str or not (via is None or (type(via) is str and via)):
        return None
    return compact("transfer", request_id, key, to=to, via=via or "")


class Session:
    """Three raw connections to one minion, driven step by step; with ``compact``, every
    request the compact form can carry is sent in it."""

    def __init__(self, path: str, compact: bool = False) -> None:
        self.path = path
        self.compact = compact
        self.compact_sent = 0
        self.compact_received = 0  # by connections since hung up
        self.conns = [Peer(path) for _ in range(3)]
        self.names: list[str | None] = [None] * 3  # the container each registered as
        self.sent: dict[tuple[int, int], str] = {}  # (connection, request id) -> op
        self.probe = Peer(path)  # asks for stat only: it receives nothing else

    def step(self, index: int, message: dict[str, Any] | None, marker: int) -> list[Any]:
        """Send one request on connection ``index`` (or hang it up) and return every reply
        any connection received because of it, checked against the document."""
        if message is None:
            self.compact_received += self.conns[index].compact_replies
            self.conns[index].close()
            self.conns[index] = Peer(self.path)
            name = self.names[index]
            if name is not None:
                self._gone(name)
            self.names[index] = None
            return []
        packed = as_compact(message) if self.compact else None
        self.compact_sent += packed is not None
        self.conns[index].send(packed or message)
        self.conns[index].send({"op": "stat", "id": marker})
        if isinstance(message.get("op"), str) and type(message.get("id")) is int:
            self.sent[(index, message["id"])] = message["op"]
        seen: list[tuple[int, dict[str, Any], int | None]] = []
        while True:  # the caller's replies first: whatever the request sent others is out then
            reply, fd = self.conns[index].receive()
            if reply["id"] == marker:
                if fd is not None:
                    os.close(fd)
                break
            if message["op"] == "register" and reply["id"] == message["id"] and reply["ok"]:
                self.names[index] = str(message["container"])
            seen.append((index, reply, fd))
        for number, peer in enumerate(self.conns):
            if number != index:
                seen += [(number, reply, fd) for reply, fd in peer.pending()]
        for number, reply, fd in seen:
            op = self.sent.get((number, reply["id"]), "?")
            assert problems_with(op, reply, fd is not None) == [], (marker, message, reply)
        normalised = [[number, normal(reply, fd)] for number, reply, fd in seen]
        return sorted(normalised, key=lambda item: item[0])

    def _gone(self, container: str) -> None:
        """Until the minion has handled the hang-up of ``container`` (its objects recovered,
        their grants sent)."""
        deadline = time.monotonic() + 10
        while container in self.probe.call("stat")[0]["containers"]:
            assert time.monotonic() < deadline, f"{container} never went away"
            time.sleep(0.005)

    @property
    def compact_replies(self) -> int:
        return self.compact_received + sum(peer.compact_replies for peer in self.conns)

    def close(self) -> None:
        self.probe.close()
        for peer in self.conns:
            peer.close()


def new_script(seed: int = 7, steps: int = 800) -> list[Step]:
    """The script the vectors hold: three registrations, then random requests and hang-ups."""
    rng = random.Random(seed)
    keys = ["k1", "k2", "k3", "k4", "nope"]
    ids = ["p0", "p1", "p2", 3]
    script: list[Step] = [
        (0, {"op": "register", "container": "p0"}),
        (1, {"op": "register", "container": "p1"}),
        (2, {"op": "register", "container": "p2"}),
    ]
    for _ in range(steps):
        if rng.random() < 0.02:
            script.append((rng.randrange(3), None))
        else:
            script.append((rng.randrange(3), random_message(rng, keys, ids)))
    return [
        (index, None if message is None else {**message, "id": number})
        for number, (index, message) in enumerate(script, start=1)
    ]


def load_vectors() -> list[tuple[int, dict[str, Any] | None, list[Any]]]:
    """``(connection, request, replies)`` for each step of the recorded script."""
    steps = []
    with VECTORS.open() as lines:
        for line in lines:
            row = json.loads(line)
            steps.append((row["conn"], _decode(row["send"]), row["replies"]))
    return steps


@pytest.mark.parametrize("form", ["map", "compact"])
def test_the_recorded_requests_get_the_recorded_replies(minion: MinionProcess, form: str) -> None:
    """``compact``: every ``access`` and ``transfer`` the compact form can carry is sent in it,
    and gets the same replies (a compact one read as the map it stands for)."""
    if os.environ.get(RECORD) and form == "map":
        _record(minion)
    vectors = load_vectors()
    assert len(vectors) > 500, "the vectors file is truncated"
    session = Session(minion.socket_path, compact=form == "compact")
    try:
        for number, (index, message, expected) in enumerate(vectors, start=1):
            got = session.step(index, message, -number)
            assert got == expected, (number, index, message)
    finally:
        session.close()
    if form == "compact":
        # The script holds 54 such requests, 9 of them answered with success (compact).
        assert session.compact_sent > 40 and session.compact_replies > 5


def _record(minion: MinionProcess) -> None:
    """Write the vectors anew from this minion (a deliberate protocol change only)."""
    session = Session(minion.socket_path)
    rows = []
    try:
        for number, (index, message) in enumerate(new_script(), start=1):
            replies = session.step(index, message, -number)
            rows.append({"conn": index, "send": _encode(message), "replies": replies})
    finally:
        session.close()
    VECTORS.parent.mkdir(exist_ok=True)
    with VECTORS.open("w") as out:
        for row in rows:
            out.write(json.dumps(row, separators=(",", ":")) + "\n")
    pytest.fail(f"recorded {len(rows)} steps into {VECTORS}: review the diff, then run again")
