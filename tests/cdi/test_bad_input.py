"""Bad input gets a clear error, and the minion loses nothing."""

from __future__ import annotations

import array
import os
import socket
from collections.abc import Callable
from pathlib import Path

import msgpack
import pytest

import cdi
from tests.cdi.conftest import MinionProcess

Unique = Callable[[str], str]


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("", "must not be empty"),
        ("x" * 257, "limit is 256"),
        ("has space", "characters outside"),
        ("nul\0byte", "characters outside"),
        ("trailing-newline\n", "characters outside"),
        (42, "must be a string"),
    ],
)
def test_bad_keys(minion: MinionProcess, unique: Unique, key: object, message: str) -> None:
    client = minion.client(unique("c"))
    with pytest.raises(cdi.InvalidArgument, match=message):
        client.create(key, 10)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("size", "error", "message"),
    [
        (-1, cdi.InvalidArgument, "must not be negative"),
        (1 << 40, cdi.InvalidArgument, "exceeds this minion's object limit"),
        (True, cdi.InvalidArgument, "must be an integer"),
        ("10", cdi.InvalidArgument, "must be an integer"),
        (2.5, cdi.InvalidArgument, "must be an integer"),
        # integers no message can carry: refused as the minion refuses any other
        (1 << 64, cdi.InvalidArgument, "exceeds this minion's object limit"),
        (1 << 100, cdi.InvalidArgument, "exceeds this minion's object limit"),
        (-(1 << 63) - 1, cdi.InvalidArgument, "must not be negative"),
    ],
)
def test_bad_sizes(
    minion: MinionProcess, unique: Unique, size: object, error: type[Exception], message: str
) -> None:
    client = minion.client(unique("c"))
    with pytest.raises(error, match=message):
        client.create(unique("k"), size)  # type: ignore[arg-type]


@pytest.mark.parametrize("size", [-1, 1 << 40, 1 << 64, -(1 << 63) - 1])
def test_a_bad_resize_is_refused(minion: MinionProcess, unique: Unique, size: int) -> None:
    client = minion.client(unique("c"))
    obj = client.create(unique("k"), 10)
    view = obj.access()
    with pytest.raises(cdi.InvalidArgument):
        obj.resize(size)
    if size.bit_length() > 63:  # refused before anything is sent: no view was revoked
        view[0] = 1
    view.release()
    assert client.describe(obj.key)["size"] == 10  # still ours, unchanged
    assert len(obj.access(timeout=0)) == 10
    obj.destroy()


def test_any_field_no_message_can_carry_is_invalid_argument(
    minion: MinionProcess, unique: Unique
) -> None:
    """Past the checks of its own, the client turns what MessagePack cannot pack into the
    tree's ``InvalidArgument``: never a raw ``OverflowError`` or ``TypeError``."""
    client = minion.client(unique("c"))
    with pytest.raises(cdi.InvalidArgument, match="cannot be sent"):
        client.create(unique("k"), 10, generation=1 << 64)
    with pytest.raises(cdi.InvalidArgument, match="cannot be sent"):
        client.create(unique("k"), 10, generation=object())  # type: ignore[arg-type]
    assert client.list_objects() == []


def test_unknown_container_and_unregistered_calls(minion: MinionProcess, unique: Unique) -> None:
    client = minion.client(unique("c"))
    obj = client.create(unique("k"), 10)
    obj.write(b"unchanged!")
    with pytest.raises(cdi.UnknownContainer, match="no live container"):
        obj.transfer("nobody-registered-this")
    with pytest.raises(cdi.InvalidArgument):
        obj.transfer("bad id with spaces")
    assert bytes(obj.read()) == b"unchanged!"  # the failed transfers lost nothing
    anonymous = minion.client()
    with pytest.raises(cdi.NotRegistered):
        anonymous.create(unique("k"), 10)
    with pytest.raises(cdi.NotRegistered):
        anonymous.use(obj.key)
    with pytest.raises(cdi.ObjectNotFound):
        client.use(unique("missing"))
    with pytest.raises(cdi.InvalidArgument):
        obj.access(timeout=-1)
    obj.destroy()


def test_duplicate_registration(minion: MinionProcess, unique: Unique) -> None:
    cid = unique("dup")
    minion.client(cid)
    with pytest.raises(cdi.ContainerExists, match="in use by a live process"):
        minion.client(cid)
    first = minion.client(unique("once"))
    with pytest.raises(cdi.ProtocolError, match="already registered"):
        first.register(unique("twice"))


def test_no_minion_running(tmp_path: Path) -> None:
    with pytest.raises(cdi.MinionUnavailable, match="cdiflow cdi minion --socket"):
        cdi.connect(str(tmp_path / "nothing.sock"), "x")
    with pytest.raises(cdi.ConfigError, match="unix://"):
        cdi.connect("http://example/", "x")


def test_garbage_on_the_wire_is_refused(minion: MinionProcess, unique: Unique) -> None:
    raw = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    raw.connect(minion.socket_path)
    try:
        for junk in (
            b"\xc1\xc1 not msgpack",
            msgpack.packb([1, 2, 3]),
            msgpack.packb({"op": "explode", "id": 1}),
            msgpack.packb({"op": "create", "id": "x"}),
            msgpack.packb({"op": ["stat"], "id": 2}),
            msgpack.packb({"op": {"stat": 1}, "id": 3}),
        ):
            raw.send(junk)
            reply = msgpack.unpackb(raw.recv(4096))
            assert reply["ok"] is False and reply["code"] in ("protocol", "not_registered")
    finally:
        raw.close()
    # The minion is unharmed.
    client = minion.client(unique("after"))
    obj = client.create(unique("k"), 3)
    obj.write(b"ok!")
    assert bytes(obj.read()) == b"ok!"
    obj.destroy()


def test_a_waiting_access_without_a_request_id_is_refused(
    minion: MinionProcess, unique: Unique
) -> None:
    owner = minion.client(unique("owner"))
    key = unique("k")
    owner.create(key, 8)
    raw = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    raw.connect(minion.socket_path)
    try:
        raw.send(msgpack.packb({"op": "register", "id": 1, "container": unique("waiter")}))
        assert msgpack.unpackb(raw.recv(4096))["ok"] is True
        raw.send(msgpack.packb({"op": "access", "key": key}))  # would wait, but no id to answer by
        reply = msgpack.unpackb(raw.recv(4096))
        assert reply["ok"] is False and reply["code"] == "protocol", reply
        assert "needs a request id" in reply["msg"]
        assert minion.stat()["waiters"] == 0
    finally:
        raw.close()
    owner.use(key).destroy()


def test_an_fd_sent_to_the_minion_is_dropped(minion: MinionProcess) -> None:
    """Clients never send memory; an fd attached to a request must not land in the minion."""
    fds_before = len(os.listdir(f"/proc/{minion.pid}/fd"))
    raw = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    raw.connect(minion.socket_path)
    read_end, write_end = os.pipe()
    try:
        for _ in range(5):
            raw.sendmsg(
                [msgpack.packb({"op": "stat", "id": 1})],
                [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [read_end]))],
            )
            assert msgpack.unpackb(raw.recv(65536))["ok"] is True
        # The raw connection itself holds one fd in the minion; the five pipe fds are gone.
        assert len(os.listdir(f"/proc/{minion.pid}/fd")) == fds_before + 1
    finally:
        raw.close()
        os.close(read_end)
        os.close(write_end)
