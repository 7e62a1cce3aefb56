"""The two minions side by side: the same random requests, the same codes and reply fields.

``test_protocol.py`` checks each minion against the document; this catches the two drifting
apart where the document leaves no test behind (the state a sequence of requests builds up).
Compared: for every reply on every connection, ``ok``, ``code``, the fields and their values,
and whether an fd came; not the message text, the minion's pid or the timestamps.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cdi.conftest import MinionProcess, require_native, start_minion, stop_minion
from tests.cdi.test_protocol import LIMITS, random_message
from tests.cdi.wire import Peer

VOLATILE = ("msg", "minion_pid", "created_at", "updated_at")


@pytest.fixture(scope="module", autouse=True)
def minion_impl() -> str:
    """Both minions run in every test here: one pass, not one per implementation."""
    return "both"


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, MinionProcess]]:
    require_native()
    base = tmp_path_factory.mktemp("differential")
    running: dict[str, MinionProcess] = {}
    try:
        for impl in ("python", "native"):
            (base / impl).mkdir()
            running[impl] = start_minion(base / impl, "--impl", impl, "--host", "h", *LIMITS)
        yield running
    finally:
        for minion in running.values():
            stop_minion(minion)


def normal(reply: dict[str, Any], fd: int | None) -> tuple[Any, ...]:
    if fd is not None:
        os.close(fd)
    fields = {k: v for k, v in reply.items() if k not in VOLATILE}
    if isinstance(fields.get("objects"), list):
        fields["objects"] = [
            {k: v for k, v in o.items() if k not in VOLATILE} for o in fields["objects"]
        ]
    return (sorted(fields.items(), key=lambda kv: kv[0]), fd is not None)


class Side:
    """Three raw connections to one minion, replayed step by step."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.conns = [Peer(path) for _ in range(3)]
        self.names: list[str | None] = [None] * 3  # the container each registered as
        self.probe = Peer(path)  # asks for stat only: it receives nothing else

    def step(self, index: int, message: dict[str, Any] | None, marker: int) -> list[Any]:
        if message is None:
            self.conns[index].close()
            self.conns[index] = Peer(self.path)
            name = self.names[index]
            if name is not None:
                self._gone(name)
            self.names[index] = None
            return []
        self.conns[index].send(message)
        self.conns[index].send({"op": "stat", "id": marker})
        seen = []
        while True:  # the caller's replies first: whatever the request sent others is out then
            reply, fd = self.conns[index].receive()
            if reply["id"] == marker:
                if fd is not None:
                    os.close(fd)
                break
            if message["op"] == "register" and reply["id"] == message["id"] and reply["ok"]:
                self.names[index] = str(message["container"])
            seen.append((index, normal(reply, fd)))
        for number, peer in enumerate(self.conns):
            if number != index:
                seen += [(number, normal(*r)) for r in peer.pending()]
        return sorted(seen, key=lambda item: item[0])

    def _gone(self, container: str) -> None:
        """Until the minion has handled the hang-up of ``container`` (its objects recovered,
        their grants sent)."""
        deadline = time.monotonic() + 10
        while container in self.probe.call("stat")[0]["containers"]:
            assert time.monotonic() < deadline, f"{container} never went away"
            time.sleep(0.005)

    def close(self) -> None:
        self.probe.close()
        for peer in self.conns:
            peer.close()


def test_the_same_requests_get_the_same_replies(pair: dict[str, MinionProcess]) -> None:
    rng = random.Random(7)
    keys = ["k1", "k2", "k3", "k4", "nope"]
    ids = ["p0", "p1", "p2", 3]
    sides = {impl: Side(minion.socket_path) for impl, minion in pair.items()}
    script: list[tuple[int, dict[str, Any] | None]] = [
        (0, {"op": "register", "container": "p0"}),
        (1, {"op": "register", "container": "p1"}),
        (2, {"op": "register", "container": "p2"}),
    ]
    for _ in range(800):
        if rng.random() < 0.02:
            script.append((rng.randrange(3), None))
        else:
            script.append((rng.randrange(3), random_message(rng, keys, ids)))
    try:
        for step, (index, message) in enumerate(script, start=1):
            if message is not None:
                message = {**message, "id": step}
            got = {impl: side.step(index, message, -step) for impl, side in sides.items()}
            assert got["python"] == got["native"], (step, index, message)
    finally:
        for side in sides.values():
            side.close()
