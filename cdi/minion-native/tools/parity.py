"""Differential test: the same requests to the Python minion and the native one, same replies.

Starts one minion of each kind, drives both through identical raw sockets (scripted edge cases,
then random requests built from the protocol's own vocabulary and from junk), and compares every
reply: fields, types, codes, messages, and whether an fd came with it. Only the minion's pid and
the timestamps of `list` may differ, and the text of a refusal of a message the Python minion
cannot decode (`undecodable message: ...`): the two decoders word those differently, so there
only the code (and the rest of the reply) must agree.

    .venv/bin/python cdi/minion-native/tools/parity.py [--rounds N] [--seed S] [--binary PATH]
"""

from __future__ import annotations

import argparse
import array
import os
import random
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgpack

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
LIMITS = ["--memory-limit", str(64 << 20), "--max-object", str(16 << 20)]


def start(kind: str, folder: Path, binary: str) -> tuple[subprocess.Popen[bytes], str]:
    path = str(folder / f"{kind}.sock")
    if kind == "python":
        argv = [sys.executable, "-m", "cdi.minion", "--impl", "python", "--socket", path]
        argv += ["--host", "parity", *LIMITS]
    else:
        argv = [binary, "--socket", path, "--host", "parity", *LIMITS, "--idle-limit"]
        argv += [str(16 << 20), "--isolation", "cooperative", "--busy-poll-us", "1000"]
        argv += ["--socket-mode", "666"]
    log = open(folder / f"{kind}.log", "wb")  # noqa: SIM115
    process = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 20
    while not os.path.exists(path):
        if time.monotonic() > deadline or process.poll() is not None:
            raise SystemExit(f"the {kind} minion did not start; see {folder / kind}.log")
        time.sleep(0.05)
    time.sleep(0.2)
    return process, path


class Peer:
    """One raw connection: send a message, collect every reply that arrives within a window."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock.connect(path)

    def send(self, data: bytes) -> None:
        self.sock.send(data)

    def replies(self, wait: float) -> list[tuple[Any, bool]]:
        got: list[tuple[Any, bool]] = []
        deadline = time.monotonic() + wait
        while True:
            remaining = max(0.0, deadline - time.monotonic())
            if not select.select([self.sock], [], [], remaining)[0]:
                return got
            data, anc, _flags, _ = self.sock.recvmsg(1 << 20, socket.CMSG_SPACE(16))
            if not data:
                got.append(("<closed>", False))
                return got
            fds = array.array("i")
            for _level, _kind, blob in anc:
                fds.frombytes(blob[: len(blob) - len(blob) % fds.itemsize])
            for fd in fds:
                os.close(fd)
            got.append((normalize(msgpack.unpackb(data, raw=False)), len(fds) > 0))
            deadline = time.monotonic() + 0.02  # anything else comes right behind

    def close(self) -> None:
        self.sock.close()


UNDECODABLE = "undecodable message: "


def undecodable(replies: list[tuple[int, tuple[Any, bool]]]) -> bool:
    """Whether the Python minion refused the message as undecodable."""
    return any(
        isinstance(reply, dict) and str(reply.get("msg", "")).startswith(UNDECODABLE)
        for _conn, (reply, _fd) in replies
    )


def without_text(replies: list[tuple[int, tuple[Any, bool]]]) -> list[Any]:
    """The replies with the messages of refusals left out: the codes are what is compared."""
    return [
        (conn, ({k: v for k, v in reply.items() if k != "msg"}, fd))
        if isinstance(reply, dict) and reply.get("ok") is False
        else (conn, (reply, fd))
        for conn, (reply, fd) in replies
    ]


def normalize(reply: Any) -> Any:
    if isinstance(reply, dict):
        reply.pop("minion_pid", None)
        for entry in reply.get("objects", []) if isinstance(reply.get("objects"), list) else []:
            for stamp in ("created_at", "updated_at"):
                assert isinstance(entry.pop(stamp), float)
    return reply


def scripted() -> list[tuple[int, Any]]:
    """(connection, message) pairs that walk the edge cases; bytes are sent as they are."""
    ts = msgpack.Timestamp(5, 7)

    def nested(depth: int) -> Any:
        value: Any = 1
        for _ in range(depth):
            value = [value]
        return value

    deep, shallow = nested(991), nested(971)
    stat = msgpack.packb({"op": "stat", "id": 1})
    stat_x = b"\x83\xa2op\xa4stat\xa2id\x01\xa1x"  # {"op": "stat", "id": 1, "x": <what follows>}
    steps: list[tuple[int, Any]] = [
        (0, b"\xc1"),
        (0, b"\x81\xa2id"),
        (0, b"\x01\x02"),
        (0, b"\x81\x01\x02"),
        (0, b"\xa2\xff\xfe"),
        (0, b"\x93\x01"),
        (0, b"\x91" * 1025 + b"\x01"),
        (0, msgpack.packb([1, 2])),
        (0, stat + b"\x00"),
        (0, stat[:-1]),
        (0, stat_x + msgpack.packb({1: 2})),
        (0, stat_x + msgpack.packb({"k": {(1, 2): 3}})),
        (0, stat_x + b"\xa2\xff\xfe"),
        (0, stat_x + b"\xd5\xff\x00\x01"),
        (0, stat_x + b"\xd7\xff\xff\xff\xff\xfc\x00\x00\x00\x05"),
        (0, stat_x + b"\xdd\xff\xff\xff\xff"),
        (0, stat_x + b"\xdf\xff\xff\xff\xff\xa1a"),
        (0, stat_x + b"\x91" * 1023 + b"\x01"),
        (0, stat_x + b"\x91" * 1024 + b"\x01"),
        (0, stat_x + b"\x91" * 1022 + b"\x90"),
        (0, stat_x + b"\x91" * 1023 + b"\x90"),
        (0, stat_x + msgpack.packb({b"bytes key": 1})),
        (0, {b"op": "stat", "id": 1}),
        (0, b"\x82\xa2op\xa4stat\xa2id\xca\x3f\x80\x00\x00"),  # a float32 id
        (0, b"\x82\xa2op\xa4stat\xa2id\xc7\x0c\xff" + bytes(4) + (5).to_bytes(8, "big")),
        (0, {"op": "stat", "id": "x"}),
        (0, {"op": "stat", "id": None}),
        (0, {"op": "stat", "id": [1, {"a": b"b"}]}),
        (0, {"op": "stat", "id": 2.5}),
        (0, {"op": "stat", "id": True}),
        (0, {"op": "stat", "id": ts}),
        (0, {"op": "stat", "id": -(2**63)}),
        (0, {"op": "stat", "id": 2**64 - 1}),
        (0, {"id": 3}),
        (0, {"op": None, "id": 3}),
        (0, {"op": 5, "id": 3}),
        (0, {"op": 2.5, "id": 3}),
        (0, {"op": b"stat", "id": 3}),
        (0, {"op": [1], "id": 3}),
        (0, {"op": {"a": 1}, "id": 3}),
        (0, {"op": msgpack.ExtType(5, b"'\""), "id": 3}),
        (0, {"op": ts, "id": 3}),
        (0, {"op": "explode", "id": 3}),
        (0, {"op": "it's", "id": 3}),
        (0, {"op": "create", "id": 4}),
        (0, {"op": "list", "id": 5}),
        (0, {"op": "register", "id": 6, "container": "a b"}),
        (0, {"op": "register", "id": 6, "container": "é" * 300}),
        (0, {"op": "register", "id": 6, "container": "\u2028x\U000e0001"}),
        (0, {"op": "register", "id": 6, "container": True}),
        (0, {"op": "register", "id": 6, "container": 12}),
        (0, {"op": "register", "id": 7, "container": "twice"}),
        (1, {"op": "register", "id": 8, "container": 12}),
        (1, {"op": "register", "id": 8, "container": "b"}),
        (2, {"op": "register", "id": 9, "container": "c"}),
        (0, {"op": "create", "id": 10, "key": "k1", "size": 10}),
        (0, {"op": "create", "id": 10, "key": "k1", "size": 10}),
        (0, {"op": "create", "id": 11, "key": "k2", "size": True}),
        (0, {"op": "create", "id": 11, "key": "k2", "size": 2.5}),
        (0, {"op": "create", "id": 11, "key": "k2", "size": -3}),
        (0, {"op": "create", "id": 11, "key": "k2", "size": 1 << 30}),
        (0, {"op": "create", "id": 11, "key": "k2", "size": 5, "isolation": "loose"}),
        (0, {"op": "create", "id": 11, "key": "k2", "size": 5, "isolation": b"strict"}),
        (0, {"op": "create", "id": 11, "key": "k2", "size": 5, "isolation": shallow}),
        (0, {"op": "create", "id": 11, "key": "k2", "size": 5, "isolation": deep}),
        *[
            (0, {"op": "create", "id": 11, "key": "k2", "size": 5, "isolation": nested(d)})
            for d in range(975, 995)
        ],
        (0, {"op": "create", "id": 11, "key": "k2", "size": 5, "zeroed": None}),
        (0, {"op": "create", "id": 11, "key": "k2", "size": 5, "zeroed": [0.1, 1e16]}),
        (0, {"op": "create", "id": 11, "key": "k2", "size": 5, "have": [True]}),
        (0, {"op": "create", "id": 11, "key": "k2", "size": 5, "recovery": "bad id"}),
        (0, {"op": "create", "id": 11, "key": "k2", "size": 5, "recovery": 0}),
        (0, {"op": "create", "id": 11, "key": "trail\n", "size": 5, "recovery": 77}),
        (0, {"op": "create", "id": 12, "key": "k3", "size": 5000, "isolation": "strict"}),
        (0, {"op": "use", "id": 13, "key": "k3"}),
        (1, {"op": "use", "id": 13, "key": "nope"}),
        (1, {"op": "use", "id": 13, "key": "no pe"}),
        (1, {"op": "use", "id": 13}),
        (1, {"op": "access", "id": 14, "key": "k1", "wait": False}),
        (1, {"op": "access", "key": "k1"}),
        (1, {"op": "access", "id": 15, "key": "k1", "have": 1}),
        (1, {"op": "access", "id": True, "key": "k1"}),
        (1, {"op": "cancel", "id": 16, "ref": 1}),
        (0, {"op": "stat", "id": 17}),
        (0, {"op": "transfer", "id": 18, "key": "k1", "to": "nobody"}),
        (0, {"op": "transfer", "id": 18, "key": "k1", "to": "bad id"}),
        (0, {"op": "transfer", "id": 18, "key": "k1", "to": 3.5}),
        (0, {"op": "transfer", "id": 19, "key": "k1", "to": "b"}),
        (0, {"op": "transfer", "id": 19, "key": "k1", "to": "b"}),
        (1, {"op": "transfer", "id": 20, "key": "k1", "to": "b"}),
        (1, {"op": "access", "id": 21, "key": "k1", "have": 1}),
        (1, {"op": "access", "id": 21, "key": "k1", "have": True}),
        (1, {"op": "copy", "id": 22, "key": "k1", "new_key": "k1"}),
        (1, {"op": "copy", "id": 22, "key": "k1", "new_key": "k1c"}),
        (1, {"op": "resize", "id": 23, "key": "k1", "size": 3000}),
        (1, {"op": "resize", "id": 23, "key": "k1", "size": 5_000_000}),
        (1, {"op": "resize", "id": 23, "key": "k1", "size": 4}),
        (1, {"op": "set_recovery", "id": 24, "key": "k1", "container": "c"}),
        (1, {"op": "set_recovery", "id": 24, "key": "k1", "container": 9}),
        (0, {"op": "transfer", "id": 25, "key": "k3", "to": 12}),
        (0, {"op": "access", "id": 26, "key": "k3"}),
        (2, {"op": "access", "id": 27, "key": "k3"}),
        (0, {"op": "transfer", "id": 28, "key": "k3", "to": "c"}),
        (2, {"op": "destroy", "id": 29, "key": "k3"}),
        (0, {"op": "cancel", "id": 30, "ref": 26}),
        (0, {"op": "cancel", "id": 30, "ref": 26}),
        (2, {"op": "access", "id": 31, "key": "k1c"}),
        (1, {"op": "destroy", "id": 32, "key": "k1c"}),
        (0, {"op": "list", "id": 33}),
        (0, {"op": "stat", "id": 34}),
        (1, {"op": "create", "id": 35, "key": "big", "size": 16 << 20}),
        (2, {"op": "create", "id": 35, "key": "big2", "size": 16 << 20}),
        (0, {"op": "create", "id": 35, "key": "big3", "size": 16 << 20}),
        (0, {"op": "create", "id": 35, "key": "big4", "size": 16 << 20}),
        (0, {"op": "stat", "id": 36}),
        (1, "<close>"),
        (0, {"op": "stat", "id": 37}),
        (0, {"op": "list", "id": 38}),
    ]
    return steps


def random_message(rng: random.Random, keys: list[str]) -> Any:
    ops = ["register", "create", "use", "copy", "access", "cancel", "transfer", "resize",
           "destroy", "set_recovery", "stat", "list", "bogus"]  # fmt: skip

    def value() -> Any:
        return rng.choice([
            None, True, False, 0, 1, -1, 7, 2**40, 2.5, "", "a", "x y", rng.choice(keys),
            b"raw", [], [1, 2], {"k": 1}, rng.randrange(1, 30), 4096, 10_000,
        ])  # fmt: skip

    if rng.random() < 0.02:
        return "<close>"  # the connection goes away: recovery and reclamation
    message: dict[str, Any] = {"op": rng.choice(ops), "id": rng.randrange(1, 50)}
    for field in ("key", "size", "to", "new_key", "container", "recovery", "isolation",
                  "have", "zeroed", "wait", "ref"):  # fmt: skip
        if rng.random() < 0.45:
            message[field] = value()
    if rng.random() < 0.6 and "key" in message:
        message["key"] = rng.choice(keys)
    if message["op"] in ("create", "resize") and rng.random() < 0.7:
        message["size"] = rng.choice([0, 1, 100, 4096, 10_000, 300_000, 3 << 20])
    if message["op"] == "transfer" and rng.random() < 0.7:
        message["to"] = rng.choice(["p0", "p1", "p2", 3])
    if message["op"] == "register":
        message["container"] = rng.choice(["p0", "p1", "p2", 3, "bad id"])
    if message["op"] == "isolation" or rng.random() < 0.1:
        message["isolation"] = rng.choice(["strict", "cooperative", None])
    return message


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--verbose", action="store_true", help="print every step's replies")
    parser.add_argument("--binary", default=str(HERE.parent / "target/release/cdi-minion"))
    options = parser.parse_args()
    rng = random.Random(options.seed)
    mismatches = 0
    with tempfile.TemporaryDirectory(prefix="cdi-parity-") as name:
        folder = Path(name)
        kinds = ("python", "native")
        minions = {k: start(k, folder, options.binary) for k in kinds}
        peers: dict[str, list[Peer]] = {k: [Peer(minions[k][1]) for _ in range(3)] for k in kinds}
        steps = scripted()
        keys = ["k1", "k2", "k3", "k4", "k1c", "nope"]
        steps += [(rng.randrange(3), random_message(rng, keys)) for _ in range(options.rounds)]
        try:
            for number, (conn, message) in enumerate(steps):
                replies = {}
                for kind in kinds:
                    peer = peers[kind][conn]
                    if message == "<close>":
                        peer.close()
                        time.sleep(0.1)
                        peers[kind][conn] = Peer(minions[kind][1])
                    else:
                        peer.send(message if isinstance(message, bytes) else msgpack.packb(message))
                    # The caller's reply first (the minion sends everything else before it),
                    # then the rest: a transfer or a destroy answers waiters too.
                    mine = [(conn, r) for r in peers[kind][conn].replies(0.15)]
                    others = [(i, r) for i, p in enumerate(peers[kind]) if i != conn
                              for r in p.replies(0.0)]  # fmt: skip
                    replies[kind] = sorted(mine + others, key=lambda item: item[0])
                if options.verbose:
                    print(f"step {number}: conn {conn} sent {message!r:.120}")
                    print(f"  {replies['python']!r:.400}")
                if undecodable(replies["python"]):
                    replies = {kind: without_text(replies[kind]) for kind in kinds}
                if replies["python"] != replies["native"]:
                    mismatches += 1
                    print(f"step {number}: conn {conn} sent {message!r:.300}")
                    for kind in kinds:
                        print(f"  {kind:7} {replies[kind]!r:.600}")
        finally:
            for kind in kinds:
                for peer in peers[kind]:
                    peer.close()
                process = minions[kind][0]
                process.send_signal(signal.SIGTERM)
                process.wait(timeout=10)
        print(f"{len(steps)} steps, {mismatches} mismatches")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
