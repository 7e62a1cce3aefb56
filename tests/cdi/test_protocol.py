"""Conformance: each minion against ``cdi/PROTOCOL.md``, over raw sockets.

The operation table and the error codes are read from the document (``tests/cdi/wire.py``), so
what is checked here is the text itself: every operation answers its listed fields with their
types and its fd rule, every field of the wrong type is ``invalid_argument``, every error
condition the document names gives its code, and random requests get well-formed replies.
"""

from __future__ import annotations

import os
import random
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest

from cdi import compact as client_form
from cdi.errors import CDIError, error_from_code
from cdi.protocol import Op
from tests.cdi.conftest import MinionProcess, start_minion, stop_minion
from tests.cdi.wire import ERROR_CODES, SPEC, Peer, compact, problems_with

Unique = Callable[[str], str]
LIMITS = ("--memory-limit", str(8 << 20), "--max-object", str(4 << 20))


@pytest.fixture(scope="module")
def small(shared_dir: Path) -> Iterator[MinionProcess]:
    """A minion with an 8 MB memory limit, so ``out_of_memory`` is reachable."""
    directory = shared_dir / "protocol"
    directory.mkdir()
    running = start_minion(directory, *LIMITS)
    try:
        yield running
    finally:
        stop_minion(running)


@pytest.fixture
def peers(small: MinionProcess) -> Iterator[Callable[[], Peer]]:
    opened: list[Peer] = []

    def open_peer() -> Peer:
        peer = Peer(small.socket_path)
        opened.append(peer)
        return peer

    yield open_peer
    for peer in opened:
        peer.close()


def registered(open_peer: Callable[[], Peer], unique: Unique) -> tuple[Peer, str]:
    peer = open_peer()
    cid = unique("c")
    reply, _ = peer.call("register", container=cid)
    assert reply["ok"], reply
    return peer, cid


def checked(peer: Peer, op: str, **fields: Any) -> tuple[dict[str, Any], bool]:
    reply, fd = peer.call(op, **fields)
    assert problems_with(op, reply, fd) == [], (op, fields, reply)
    return reply, fd


def waiting(peer: Peer, count: int) -> None:
    """Until the minion holds ``count`` deferred accesses (sent on other connections)."""
    deadline = time.monotonic() + 10
    while peer.call("stat")[0]["waiters"] != count:
        assert time.monotonic() < deadline, "the access never started waiting"
        time.sleep(0.005)


def test_the_document_covers_every_operation_and_code() -> None:
    assert set(SPEC) == {str(op) for op in Op}
    for code in ERROR_CODES:
        error = error_from_code(code, "x")
        assert error.code == code, f"{code} has no class in cdi/errors.py"
        assert type(error) is not CDIError or code == CDIError.code


def test_every_operation_answers_its_fields(peers: Callable[[], Peer], unique: Unique) -> None:
    a, a_id = registered(peers, unique)
    b, b_id = registered(peers, unique)
    anonymous = peers()
    checked(anonymous, "stat")
    checked(anonymous, "list")
    key = unique("k")
    grant, fd = checked(a, "create", key=key, size=5000, isolation="cooperative", zeroed=False)
    assert fd and (grant["size"], grant["generation"], grant["isolation"]) == (
        5000,
        1,
        "cooperative",
    )
    assert grant["capacity"] >= 5000 and grant["capacity"] % os.sysconf("SC_PAGESIZE") == 0
    again, fd = checked(a, "access", key=key, have=grant["segment"])
    assert not fd, "access with have naming the object's segment sends no fd"
    assert again == {**grant, "id": again["id"]}
    _, fd = checked(a, "access", key=key)
    assert fd
    used, _ = checked(b, "use", key=key)
    assert (used["size"], used["owner"], used["isolation"]) == (5000, a_id, "cooperative")
    checked(a, "set_recovery", key=key, container=b_id)
    copy_key = unique("copy")
    copied, fd = checked(a, "copy", key=key, new_key=copy_key)
    assert fd and copied["generation"] == 1 and copied["segment"] != grant["segment"]
    resized, _ = checked(a, "resize", key=copy_key, size=20000)
    assert resized["size"] == 20000 and resized["generation"] == 2
    listed, _ = checked(a, "list")
    mine = [o for o in listed["objects"] if o["key"] in (key, copy_key)]
    assert [o["key"] for o in mine] == [key, copy_key]  # creation order
    item = SPEC["list"]  # the item fields are in the prose; check their types here
    assert item.reply[0].name == "objects"
    for name, kind in {
        "key": str, "size": int, "capacity": int, "owner": str, "creator": str,
        "recovery": str, "isolation": str, "generation": int, "host": str,
        "readers": list, "segment": int, "created_at": float, "updated_at": float,
    }.items():  # fmt: skip
        assert all(type(o[name]) is kind for o in mine), name
    assert mine[0]["recovery"] == b_id
    stat, _ = checked(a, "stat")
    assert a_id in stat["containers"] and b_id in stat["containers"]
    # A deferred access is answered, before the reply to the transfer, with a grant and its fd.
    b.send({"op": "access", "id": 77, "key": key})
    waiting(anonymous, 1)
    moved, _ = checked(a, "transfer", key=key, to=b_id)
    assert moved["generation"] == 2
    (granted, grant_fd), *rest = b.pending()
    assert not rest and granted["id"] == 77 and grant_fd is not None
    os.close(grant_fd)
    assert problems_with("access", granted, True) == []
    assert granted["generation"] == 2
    # A share: the reader's deferred read is answered; the owner's writes wait for the release.
    c, c_id = registered(peers, unique)
    c.send({"op": "read", "id": 80, "key": key})
    waiting(anonymous, 1)
    shared, _ = checked(b, "share", key=key, readers=[c_id, c_id])
    assert shared["readers"] == [c_id]
    (read_grant, read_fd), *rest = c.pending()
    assert not rest and read_grant["id"] == 80 and read_fd is not None
    os.close(read_fd)
    assert problems_with("read", read_grant, True) == []
    _, fd = checked(b, "read", key=key)  # the owner reads too, without a share
    assert fd
    _, fd = checked(c, "read", key=key)
    assert fd
    b.send({"op": "access", "id": 81, "key": key})
    waiting(anonymous, 1)  # the owner's access waits while c reads
    released, _ = checked(c, "release", key=key)
    assert (released["released"], released["readers"]) == (True, 0)
    (owned, owned_fd), *rest = b.pending()
    assert (
        not rest
        and owned["id"] == 81
        and problems_with("access", owned, owned_fd is not None) == []
    )
    if owned_fd is not None:
        os.close(owned_fd)
    released, _ = checked(c, "release", key=key)
    assert (released["released"], released["readers"]) == (False, 0)
    cancelled, _ = checked(b, "cancel", ref=12345)
    assert cancelled["cancelled"] is False
    a.send({"op": "access", "id": 78, "key": key})
    cancelled, _ = checked(a, "cancel", ref=78)
    assert cancelled["cancelled"] is True
    for peer, k in ((b, key), (a, copy_key)):
        gone, _ = checked(peer, "destroy", key=k)
        assert set(gone) >= {"id", "ok"}


def test_the_shortcuts_for_a_host_gateway(peers: Callable[[], Peer], unique: Unique) -> None:
    """``transfer`` with ``via``, ``use``'s recovery container and generation, ``create`` with
    a generation (this test runs as root or the minion's uid, who may set one)."""
    a, a_id = registered(peers, unique)
    slot, slot_id = registered(peers, unique)
    key = unique("k")
    checked(a, "create", key=key, size=100)
    used, _ = checked(slot, "use", key=key)
    assert (used["owner"], used["recovery"], used["generation"]) == (a_id, a_id, 1)
    # ``to`` is not here: the object goes to ``via``, and the reply says so.
    moved, _ = checked(a, "transfer", key=key, to=unique("elsewhere"), via=slot_id)
    assert (moved["to"], moved["generation"]) == (slot_id, 2)
    used, _ = checked(a, "use", key=key)
    assert (used["owner"], used["recovery"], used["generation"]) == (slot_id, a_id, 2)
    # ``to`` is here: ``via`` is not used.
    back, _ = checked(slot, "transfer", key=key, to=a_id, via=slot_id)
    assert (back["to"], back["generation"]) == (a_id, 3)
    plain, _ = checked(a, "transfer", key=key, to=slot_id)
    assert plain["to"] == slot_id
    # Neither is live: unknown_container, and the owner stays.
    reply, _ = slot.call("transfer", key=key, to=unique("x"), via=unique("y"))
    assert (reply["ok"], reply["code"]) == (False, "unknown_container"), reply
    assert checked(a, "use", key=key)[0]["owner"] == slot_id
    # A generation carried on from another host; out of range is invalid_argument.
    carried = unique("carried")
    grant, _ = checked(a, "create", key=carried, size=10, generation=7)
    assert grant["generation"] == 7
    assert checked(slot, "use", key=carried)[0]["generation"] == 7
    assert checked(a, "transfer", key=carried, to=slot_id)[0]["generation"] == 8
    for wrong in (0, -1, 2**63):
        reply, _ = a.call("create", key=unique("g"), size=10, generation=wrong)
        assert (reply["ok"], reply["code"]) == (False, "invalid_argument"), (wrong, reply)
    for k in (key, carried):
        assert slot.call("destroy", key=k)[0]["ok"]


def test_the_compact_form_is_answered_as_the_map_form(
    peers: Callable[[], Peer], unique: Unique
) -> None:
    """``access`` and ``transfer`` in the compact form: the map form's rules and fields, a
    success (a deferred grant too) answered compact, a failure as the error map."""
    a, b, slot = peers(), peers(), peers()
    ids = []
    for peer in (a, b, slot):
        ids.append(unique("c"))
        reply, _ = checked(peer, "register", container=ids[-1])
        assert reply["compact"] == 1
    a_id, b_id, slot_id = ids
    key = unique("k")
    grant, _ = checked(a, "create", key=key, size=5000)
    b.send(compact("access", 41, key))  # waits, and is granted compact before a hears back
    waiting(slot, 1)
    a.send(compact("transfer", 42, key, to=b_id))
    moved, fd = a.receive()
    assert fd is None and a.compact_replies == 1
    assert moved == {"id": 42, "ok": True, "generation": 2, "keep_mapping": moved["keep_mapping"],
                     "to": b_id} and type(moved["keep_mapping"]) is bool  # fmt: skip
    (granted, grant_fd), *rest = b.pending()
    assert not rest and grant_fd is not None and b.compact_replies == 1
    os.close(grant_fd)
    assert granted == {**grant, "id": 41, "generation": 2}
    assert problems_with("access", granted, True) == []
    b.send(compact("access", 43, key, wait=False, have=grant["segment"]))
    again, fd = b.receive()
    assert fd is None and again == {**granted, "id": 43}, "have names the segment: no fd"
    b.send(compact("access", 44, key, wait=False, have=-1))
    again, fd = b.receive()
    assert fd is not None and again == {**granted, "id": 44}
    os.close(fd)
    # Failures are the error maps, with the map form's codes.
    for peer, request_id, message, code in (
        (a, 45, compact("access", 45, key, wait=False), "not_owner"),
        (a, 46, compact("transfer", 46, key, to=a_id), "not_owner"),
        (b, 47, compact("transfer", 47, key, to=unique("nobody")), "unknown_container"),
        (b, 48, compact("transfer", 48, unique("missing"), to=a_id), "not_found"),
        (b, 49, compact("transfer", 49, key, to="bad id"), "invalid_argument"),
        (b, 50, compact("access", 50, ""), "invalid_argument"),
    ):
        peer.send(message)
        reply, fd = peer.receive()
        assert (reply["id"], reply["ok"], reply["code"], fd) == (request_id, False, code, None)
    # ``via``: ``to`` is not here, so the object goes to the slot.
    b.send(compact("transfer", 51, key, to=unique("elsewhere"), via=slot_id))
    moved, _ = b.receive()
    assert (moved["id"], moved["to"], moved["generation"]) == (51, slot_id, 3)
    # A deferred compact access is withdrawn like any other.
    b.send(compact("access", 52, key))
    waiting(a, 1)
    assert checked(b, "cancel", ref=52)[0]["cancelled"] is True
    assert checked(slot, "destroy", key=key)[0]["ok"]
    assert b.compact_replies == 4 and a.compact_replies == 1


def test_a_malformed_compact_message_is_a_protocol_error(
    peers: Callable[[], Peer], unique: Unique
) -> None:
    peer, cid = registered(peers, unique)
    good = compact("transfer", 5, "k", to=cid)
    access = compact("access", 5, "k")
    for junk in (
        good[:25],  # shorter than the header
        good[:-1],  # lengths beyond the message
        good + b"\x00",  # bytes after the strings
        good[:1] + b"\x02" + good[2:],  # another version
        good[:2] + b"\x03" + good[3:],  # no such operation
        good[:3] + b"\x01" + good[4:],  # a flag a transfer does not have
        access[:3] + b"\x04" + access[4:],  # a flag no access has
        compact("access", 5, "k", to=cid),  # a field an access does not have
        access[:-1] + b"\xff",  # a key that is not UTF-8
    ):
        peer.send(junk)
        reply, fd = peer.receive()
        assert (reply["ok"], reply["code"], reply["id"], fd) == (False, "protocol", 0, None), junk
    assert peer.call("stat")[0]["ok"]  # and the connection goes on
    anonymous = peers()
    anonymous.send(compact("access", 6, "k"))
    assert anonymous.receive()[0]["code"] == "not_registered"


def test_the_client_writes_the_compact_form_the_document_lays_out() -> None:
    """``cdi.compact`` (the client's) against ``compact`` here, built from the document; what the
    form cannot carry goes as a map (``None``)."""
    assert client_form.encode_request("transfer", 7, {"key": "k", "to": "b"}) == compact(
        "transfer", 7, "k", to="b"
    )
    assert client_form.encode_request(
        "transfer", 7, {"key": "k", "to": "b", "via": "s"}
    ) == compact("transfer", 7, "k", to="b", via="s")
    assert client_form.encode_request("access", 8, {"key": "k"}) == compact("access", 8, "k")
    assert client_form.encode_request(
        "access", 8, {"key": "k", "wait": False, "have": -3}
    ) == compact("access", 8, "k", wait=False, have=-3)
    for op, args in (
        ("access", {"key": "k", "have": 1 << 63}),
        ("access", {"key": "k", "wait": 1}),
        ("access", {"key": "k", "ref": 1}),
        ("transfer", {"key": "k", "to": 3}),
        ("transfer", {"key": "k"}),
        ("use", {"key": "k"}),
    ):
        assert client_form.encode_request(op, 1, args) is None, (op, args)


def test_an_access_waits_for_an_object_still_on_its_way(
    peers: Callable[[], Peer], unique: Unique
) -> None:
    """``arriving``: an access of a key nobody has created yet waits for it (a gateway creates
    it when it arrives from another host), and is answered ``not_found`` if none comes."""
    a, _ = registered(peers, unique)
    b, b_id = registered(peers, unique)
    anonymous = peers()
    key = unique("k")
    b.send({"op": "access", "id": 31, "key": key, "arriving": 30.0})
    waiting(anonymous, 1)
    assert b.pending() == []
    checked(a, "create", key=key, size=100)  # not b's yet: b goes on waiting
    assert b.pending() == []
    checked(a, "transfer", key=key, to=b_id)
    granted, fd = b.receive()
    assert granted["id"] == 31 and problems_with("access", granted, fd is not None) == []
    assert fd is not None
    os.close(fd)
    # Nothing comes: not_found once the budget is spent; without one, at once.
    missing = unique("never")
    b.send({"op": "access", "id": 32, "key": missing, "arriving": 0.2})
    refused, refused_fd = b.receive()
    assert (refused["id"], refused["code"], refused_fd) == (32, "not_found", None)
    assert checked(b, "stat")[0]["waiters"] == 0
    reply, _ = b.call("access", key=missing)
    assert reply["code"] == "not_found"
    assert b.call("destroy", key=key)[0]["ok"]


# Values of the wrong type (or out of range) for each field type of the table.
WRONG: dict[str, list[Any]] = {
    "key": [42, "has space", "", "x" * 257, True],
    "cid": [2.5, "bad id", True, [1]],
    "int": ["10", True, 2.5],
    "str": [5, "loose"],
    "bool": ["yes", 1],
    "float": ["soon", True, -1.0, 7200.0],
    "[int]": ["x", [1.5], [True], list(range(65))],
    "[cid]": ["p0", [], [2.5], ["bad id"], [f"c{i}" for i in range(65)]],
}


def _field_cases() -> list[tuple[str, str, Any]]:
    cases = []
    for op in SPEC.values():
        for field in op.request:
            cases += [(op.name, field.name, wrong) for wrong in WRONG[field.type]]
    return cases


@pytest.mark.parametrize(("op", "field", "wrong"), _field_cases())
def test_a_field_of_the_wrong_type_is_invalid_argument(
    peers: Callable[[], Peer], unique: Unique, op: str, field: str, wrong: Any
) -> None:
    if op == "register":
        peer = peers()
        base: dict[str, Any] = {"container": unique("c")}
    else:
        peer, cid = registered(peers, unique)
        key = unique("k")
        assert peer.call("create", key=key, size=10)[0]["ok"]
        bases: dict[str, dict[str, Any]] = {
            "create": {"key": unique("new"), "size": 10},
            "use": {"key": key},
            "access": {"key": key},
            "cancel": {"ref": 5},
            "transfer": {"key": key, "to": cid},
            "copy": {"key": key, "new_key": unique("copy")},
            "resize": {"key": key, "size": 10},
            "destroy": {"key": key},
            "set_recovery": {"key": key, "container": cid},
            "share": {"key": key, "readers": [registered(peers, unique)[1]]},
            "read": {"key": key},
            "release": {"key": key},
            "list": {},
        }
        base = bases[op]
    reply, fd = peer.call(op, **{**base, field: wrong})
    assert problems_with(op, reply, fd) == []
    assert (reply["ok"], reply.get("code")) == (False, "invalid_argument"), reply
    assert peer.call("stat")[0]["ok"]  # and the connection goes on


def test_each_documented_error_condition_gives_its_code(
    peers: Callable[[], Peer], unique: Unique
) -> None:
    a, a_id = registered(peers, unique)
    b, b_id = registered(peers, unique)
    key = unique("k")
    assert a.call("create", key=key, size=100)[0]["ok"]

    def code(peer: Peer, message: dict[str, Any] | bytes) -> tuple[str | None, int]:
        peer.send(message)
        reply, fd = peer.receive()
        assert fd is None
        return reply.get("code"), reply["id"]

    anonymous = peers()
    big = msgpack.packb({"op": "stat", "id": 5, "pad": "x" * (1 << 20)})
    if os.geteuid() == 0:  # a send buffer that takes a message over 1 MiB (SO_SNDBUFFORCE)
        anonymous.sock.setsockopt(socket.SOL_SOCKET, 32, 4 << 20)
    else:
        big = b"\xc1"  # the kernel refuses to send it: the limit is not reachable here
    for junk in (b"\xc1 not msgpack", msgpack.packb([1, 2]), b"\x81\x01\x02", b"\xa2\xff\xfe",
                 msgpack.packb({"op": "stat", "id": 1}) + b"\x00", big,
                 msgpack.packb({"op": "stat", "id": "x"}),
                 msgpack.packb({"op": "stat", "id": True}),
                 msgpack.packb({"op": "stat", "id": 2.5})):  # fmt: skip
        assert code(anonymous, junk) == ("protocol", 0), junk[:40]
    assert code(anonymous, {"op": "explode", "id": 3}) == ("protocol", 3)
    assert code(anonymous, {"op": 5, "id": 4}) == ("protocol", 4)
    assert code(anonymous, {"id": 5}) == ("protocol", 5)
    assert code(anonymous, {"op": "stat", "id": None})[0] is None  # nil id: absent, so 0
    assert code(anonymous, {"op": "create", "id": 6, "key": unique("k"), "size": 1}) == (
        "not_registered", 6)  # fmt: skip
    assert code(a, {"op": "register", "id": 7, "container": unique("c")}) == ("protocol", 7)
    assert code(b, {"op": "access", "key": key}) == ("protocol", 0)  # would wait: needs an id
    assert code(peers(), {"op": "register", "id": 8, "container": a_id}) == (
        "container_exists", 8)  # fmt: skip
    assert code(a, {"op": "transfer", "id": 9, "key": key, "to": unique("nobody")}) == (
        "unknown_container", 9)  # fmt: skip
    assert code(a, {"op": "create", "id": 10, "key": key, "size": 1}) == ("key_exists", 10)
    assert code(a, {"op": "copy", "id": 11, "key": key, "new_key": key}) == ("key_exists", 11)
    missing = unique("missing")
    for op in ("use", "access", "transfer", "copy", "resize", "destroy", "set_recovery"):
        assert code(b, {"op": op, "id": 12, "key": missing})[0] == "not_found", op
    for op, extra in (
        ("transfer", {"to": b_id}),
        ("copy", {"new_key": unique("c")}),
        ("resize", {"size": 5}),
        ("destroy", {}),
        ("set_recovery", {"container": b_id}),
        ("access", {"wait": False}),
    ):
        assert code(b, {"op": op, "id": 13, "key": key, **extra}) == ("not_owner", 13), op
    assert code(a, {"op": "create", "id": 14, "key": unique("k"), "size": 5 << 20}) == (
        "invalid_argument", 14)  # beyond max_object  # fmt: skip
    held = []
    for _ in range(3):
        held_key = unique("big")
        reply, _ = a.call("create", key=held_key, size=4 << 20)
        if not reply["ok"]:
            assert reply["code"] == "out_of_memory"
            break
        held.append(held_key)
    else:
        raise AssertionError("three 4 MB objects fit an 8 MB minion")
    # While shared: the owner's writes, transfer, resize and destroy are refused with shared.
    assert code(a, {"op": "share", "id": 16, "key": key, "readers": [a_id]}) == (
        "invalid_argument", 16)  # fmt: skip
    assert code(a, {"op": "share", "id": 16, "key": key, "readers": [unique("x")]}) == (
        "unknown_container", 16)  # fmt: skip
    assert code(b, {"op": "share", "id": 16, "key": key, "readers": [a_id]}) == ("not_owner", 16)
    assert code(b, {"op": "read", "id": 16, "key": key, "wait": False}) == ("not_owner", 16)
    assert code(b, {"op": "read", "key": key}) == ("protocol", 0)  # would wait: needs an id
    assert a.call("share", key=key, readers=[b_id])[0]["ok"]
    for op, extra in (
        ("transfer", {"to": b_id}),
        ("resize", {"size": 5}),
        ("destroy", {}),
        ("access", {"wait": False}),
    ):
        assert code(a, {"op": op, "id": 17, "key": key, **extra}) == ("shared", 17), op
    assert b.call("release", key=key)[0]["released"] is True
    # A deferred access whose object is destroyed is answered not_found.
    b.send({"op": "access", "id": 15, "key": key})
    waiting(anonymous, 1)
    assert a.call("destroy", key=key)[0]["ok"]
    (refused, refused_fd), *rest = b.pending()
    assert not rest and refused_fd is None and (refused["id"], refused["code"]) == (15, "not_found")
    for held_key in held:
        assert a.call("destroy", key=held_key)[0]["ok"]


def random_message(rng: random.Random, keys: list[str], ids: list[Any]) -> dict[str, Any]:
    """A request built from the protocol's vocabulary and from junk."""

    def value() -> Any:
        return rng.choice([
            None, True, False, 0, 1, -1, 7, 2**40, 2.5, "", "a", "x y", rng.choice(keys),
            b"raw", [], [1, 2], {"k": 1}, rng.randrange(1, 30), 4096, 10_000,
        ])  # fmt: skip

    op = rng.choice([*SPEC, "bogus"])
    if rng.random() < 0.5 and op in SPEC:  # a well-formed one, to build up state
        clean: dict[str, Any] = {"op": op, "key": rng.choice(keys), "to": rng.choice(ids)}
        clean.update(
            size=rng.choice([0, 100, 4096, 10_000, 300_000]),
            new_key=rng.choice(keys),
            container=rng.choice(ids),
            ref=rng.randrange(1, 30),
            wait=rng.random() < 0.7,
            readers=[rng.choice(ids) for _ in range(rng.randrange(1, 3))],
        )
        required = [f.name for f in SPEC[op].request if not f.optional or f.name == "wait"]
        return {name: clean[name] for name in ("op", *required)}
    message: dict[str, Any] = {"op": op}
    for field in ("key", "size", "to", "new_key", "container", "recovery", "isolation",
                  "have", "zeroed", "wait", "ref"):  # fmt: skip
        if rng.random() < 0.45:
            message[field] = value()
    if rng.random() < 0.6:
        message["key"] = rng.choice(keys)
    if message["op"] in ("create", "resize") and rng.random() < 0.7:
        message["size"] = rng.choice([0, 1, 100, 4096, 10_000, 300_000, 3 << 20])
    if message["op"] == "transfer" and rng.random() < 0.7:
        message["to"] = rng.choice(ids)
    if message["op"] == "register":
        message["container"] = rng.choice([*ids, "bad id"])
    if rng.random() < 0.1:
        message["isolation"] = rng.choice(["strict", "cooperative", None])
    return message


def test_random_requests_get_well_formed_replies(small: MinionProcess) -> None:
    rng = random.Random(20240601)
    keys = ["k1", "k2", "k3", "k4", "nope"]
    ids = ["p0", "p1", "p2", 3]
    conns = [Peer(small.socket_path) for _ in range(3)]
    sent: dict[tuple[int, int], str] = {}  # (connection, request id) -> op
    try:
        for step in range(1, 700):
            index = rng.randrange(3)
            if rng.random() < 0.02:
                conns[index].close()  # its objects go to recovery or are reclaimed
                conns[index] = Peer(small.socket_path)
                continue
            message = random_message(rng, keys, ids)
            message["id"] = step
            sent[(index, step)] = str(message["op"])
            conns[index].send(message)
            conns[index].send({"op": "stat", "id": -step})  # replies in order: a marker
            replies: list[tuple[int, dict[str, Any], int | None]] = []
            while True:  # the caller's first: whatever its request sent others is out then
                reply, fd = conns[index].receive()
                replies.append((index, reply, fd))
                if reply["id"] == -step:
                    break
            for number, peer in enumerate(conns):
                if number != index:
                    replies += [(number, reply, fd) for reply, fd in peer.pending()]
            for number, reply, fd in replies:
                if fd is not None:
                    os.close(fd)
                op = "stat" if reply["id"] < 0 else sent.get((number, reply["id"]), "?")
                assert problems_with(op, reply, fd is not None) == [], (step, message, reply)
        assert conns[0].call("stat")[0]["ok"]  # still serving
    finally:
        for peer in conns:
            peer.close()
