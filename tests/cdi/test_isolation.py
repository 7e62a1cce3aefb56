"""Isolation that the kernel enforces, and what each isolation mode promises."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import cdi
from tests.cdi.conftest import (
    INTRUDER_UID,
    OUTSIDER_UID,
    OWNER_UID,
    ROOT,
    MinionProcess,
    as_uid,
    start_minion,
    stop_minion,
)

# Every test with the client's hot path native, then in Python (``client_path``).
pytestmark = pytest.mark.usefixtures("client_path")

Unique = Callable[[str], str]
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run actors as other uids")


def actor(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.cdi.actors", *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )


def read_json(process: subprocess.Popen[str]) -> dict[str, object]:
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line, f"actor exited early with {process.wait()}"
    result: dict[str, object] = json.loads(line)
    return result


def finish(process: subprocess.Popen[str]) -> int:
    """Let the actor go on, collect what it prints and close its pipes."""
    process.communicate("go\n", timeout=30)
    return process.returncode


@needs_root
def test_a_non_owner_under_another_uid_cannot_reach_the_memory(
    minion: MinionProcess, unique: Unique
) -> None:
    key = unique("secret")
    owner = actor(
        "owner", minion.socket_path, as_uid(OWNER_UID, unique("owner")), key, "TOPSECRET",
        str(OWNER_UID),
    )  # fmt: skip
    try:
        ready = read_json(owner)
        assert ready["uid"] == OWNER_UID
        intruder = actor(
            "intruder",
            minion.socket_path,
            as_uid(INTRUDER_UID, unique("intruder")),
            key,
            str(ready["pid"]),
            str(minion.pid),
            str(INTRUDER_UID),
        )
        seen = read_json(intruder)
        assert finish(intruder) == 0
    finally:
        assert finish(owner) == 0
    assert seen["uid"] == INTRUDER_UID
    assert seen["minion_read"] == seen["minion_access"] == "not_found"
    # The kernel refuses every other path to the pages: fds, mappings, raw memory.
    assert seen["owner_fds"] == ["permission_denied"]
    assert seen["owner_maps"] == ["permission_denied"]
    assert seen["minion_fds"] == ["permission_denied"]
    assert seen["owner_mem"] == "permission_denied"
    assert "TOPSECRET" not in json.dumps(seen)


@needs_root
def test_memory_one_uid_was_handed_never_serves_another(
    minion: MinionProcess, unique: Unique
) -> None:
    """The attack: a process keeps the fd of an object it created and destroyed; a process of
    another uid then creates an object of the same size and writes to it. Freed memory goes
    back to a pool of its own uid only, so the kept mapping never shows the second object."""
    keeper = actor(
        "fd_keeper", minion.socket_path, as_uid(OWNER_UID, unique("keeper")), unique("k"),
        str(OWNER_UID),
    )  # fmt: skip
    try:
        kept_segment = read_json(keeper)["segment"]
        client = minion.client(unique("root"))
        obj = client.create(unique("k"), 4096, zeroed=False)
        obj.write(b"ROOT SECRET")
        assert client._session.owned.maps[obj.key].segment != kept_segment
        assert keeper.stdin is not None
        keeper.stdin.write("go\n")
        keeper.stdin.flush()
        kept = bytes.fromhex(str(read_json(keeper)["kept"]))
        assert b"ROOT SECRET" not in kept
        obj.destroy()
    finally:
        assert finish(keeper) == 0


@needs_root
def test_the_library_keeps_no_mapping_another_uid_may_get(
    minion: MinionProcess, unique: Unique
) -> None:
    """The client's mapping cache: after a destroy it may keep the mapping (that memory serves
    its own uid only), after a transfer to another uid it must not."""
    root = minion.client(unique("root"))
    key = unique("k")
    keeper = actor(
        "cache_keeper", minion.socket_path, as_uid(OWNER_UID, unique("cache")), key,
        root.container_id or "", str(OWNER_UID),
    )  # fmt: skip
    try:
        assert read_json(keeper)["cached_after_destroy"] == [f"{key}-a"]
        assert read_json(keeper)["cached_after_transfer"] == [f"{key}-a"]  # b's mapping went
        received = root.use(f"{key}-b")
        assert bytes(received.access(timeout=10)[:6]) == b"second"
        with received.view() as buf:
            buf[:11] = b"ROOT SECRET"
        other = root.create(unique("k"), 4096, zeroed=False)  # never the keeper's memory
        other.write(b"ROOT SECRET")
        assert keeper.stdin is not None
        keeper.stdin.write("go\n")
        keeper.stdin.flush()
        hexes = read_json(keeper)["seen"]
        assert isinstance(hexes, list)
        seen = [bytes.fromhex(h) for h in hexes]
        assert seen and not any(b"ROOT SECRET" in chunk for chunk in seen)
        received.destroy()
        other.destroy()
    finally:
        assert finish(keeper) == 0


@needs_root
def test_a_name_reserved_for_another_uid_cannot_be_taken(
    minion: MinionProcess, unique: Unique
) -> None:
    """The squatter registers first, under another uid, the name a container will use: refused,
    and so is a name the configuration gives nobody (only the minion's uid may have those)."""
    theirs, unclaimed, its_own = (
        as_uid(OWNER_UID, unique("detector")), unique("free"), as_uid(INTRUDER_UID, unique("x"))
    )  # fmt: skip
    squatting = actor("squatter", minion.socket_path, str(INTRUDER_UID), theirs, unclaimed, its_own)
    outcomes = read_json(squatting)["outcomes"]
    assert finish(squatting) == 0
    assert outcomes == {
        theirs: "name_not_allowed",
        unclaimed: "name_not_allowed",
        its_own: "registered",
    }
    rightful = actor("squatter", minion.socket_path, str(OWNER_UID), theirs)
    assert read_json(rightful)["outcomes"] == {theirs: "registered"}
    assert finish(rightful) == 0


@needs_root
def test_only_the_socket_group_connects(minion: MinionProcess) -> None:
    mode = os.stat(minion.socket_path).st_mode & 0o777
    assert mode == 0o660
    knocking = actor("outsider", minion.socket_path, str(OUTSIDER_UID))
    result = read_json(knocking)
    assert finish(knocking) == 0
    assert result["connect"] == "refused", result


@needs_root
def test_another_uid_sees_none_of_our_objects(minion: MinionProcess, unique: Unique) -> None:
    """list, use and stat show a caller of another uid only what it may see."""
    ours = minion.client(unique("root"))
    obj = ours.create(unique("k"), 10)
    snooper_id = as_uid(INTRUDER_UID, unique("snoop"))
    snooping = actor("snoop", minion.socket_path, snooper_id, obj.key, str(INTRUDER_UID))
    seen = read_json(snooping)
    assert finish(snooping) == 0
    assert seen["listed"] == [f"{snooper_id}-own"] and seen["listed_by_key"] == []
    assert seen["use"] == "not_found" and seen["destroy"] == "not_found"
    assert seen["containers"] == [snooper_id]
    assert obj.key in {o["key"] for o in ours.list_objects()}  # the minion's uid sees all
    assert [o["key"] for o in ours.list_objects(obj.key)] == [obj.key]
    obj.destroy()


@pytest.mark.parametrize("mode", ["strict", "cooperative"])
def test_a_former_owner_that_kept_its_mapping(shared_dir: Path, unique: Unique, mode: str) -> None:
    """Strict mode truncates the old segment: a cheating former owner faults instead of reading
    what the new owner writes. Cooperative mode documents that it cannot stop such a cheat."""
    directory = shared_dir / unique(mode)
    directory.mkdir()
    running = start_minion(directory, "--isolation", mode)
    try:
        me = running.client(unique("me"))
        obj = me.create(unique("k"), 4096)
        cheat = actor(
            "stale_reader", running.socket_path, unique("cheat"), obj.key, me.container_id or ""
        )
        obj.transfer(str(_registered_other(running, me)))
        assert read_json(cheat)["ready"]
        obj.write(b"NEW OWNER DATA")  # ownership came back to us; write something private
        code = finish_reading(cheat)
        if mode == "strict":
            assert code == -signal.SIGBUS, f"stale mapping should fault, got exit {code}"
        else:
            assert code == 0
        obj.destroy()
    finally:
        stop_minion(running)


def _registered_other(running: MinionProcess, me: cdi.Client) -> str:
    """The cheating actor's container id, once it has registered."""
    for _ in range(600):
        containers = running.stat()["containers"]
        assert isinstance(containers, list)
        others = [c for c in containers if c != me.container_id]
        if others:
            return str(others[0])
        time.sleep(0.05)
    raise AssertionError("the actor never registered")


def finish_reading(process: subprocess.Popen[str]) -> int:
    output, _ = process.communicate("go\n", timeout=30)
    code = process.returncode
    assert b"NEW OWNER DATA".hex() not in output or code == 0
    if code == 0:
        stale = json.loads(output.strip().splitlines()[-1])["stale"]
        assert bytes.fromhex(stale).startswith(b"NEW OWNER DATA")  # cooperative: it could read
    return code
