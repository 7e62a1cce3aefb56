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
from tests.cdi.conftest import ROOT, MinionProcess, start_minion, stop_minion

Unique = Callable[[str], str]
OWNER_UID, INTRUDER_UID = 1001, 1002


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


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run actors under other uids")
def test_a_non_owner_under_another_uid_cannot_reach_the_memory(
    minion: MinionProcess, unique: Unique
) -> None:
    key = unique("secret")
    owner = actor("owner", minion.socket_path, unique("owner"), key, "TOPSECRET", str(OWNER_UID))
    try:
        ready = read_json(owner)
        assert ready["uid"] == OWNER_UID
        intruder = actor(
            "intruder",
            minion.socket_path,
            unique("intruder"),
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
    assert seen["minion_read"] == "not_owner"
    # The kernel refuses every other path to the pages: fds, mappings, raw memory.
    assert seen["owner_fds"] == ["permission_denied"]
    assert seen["owner_maps"] == ["permission_denied"]
    assert seen["minion_fds"] == ["permission_denied"]
    assert seen["owner_mem"] == "permission_denied"
    assert "TOPSECRET" not in json.dumps(seen)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run actors under other uids")
def test_another_uids_old_bytes_are_zeroed_even_when_not_asked(
    minion: MinionProcess, unique: Unique
) -> None:
    """``zeroed=False`` never hands out bytes that a process of another uid wrote."""
    owner = actor(
        "owner", minion.socket_path, unique("owner"), unique("secret"), "TOPSECRET", str(OWNER_UID)
    )
    assert read_json(owner)["uid"] == OWNER_UID
    assert finish(owner) == 0  # it destroys its object: the segment goes back to the pool
    zeroed = int(str(minion.stat()["zeroed_bytes"]))
    client = minion.client(unique("root"))
    obj = client.create(unique("k"), 4096, zeroed=False)  # the owner's segment, just released
    assert bytes(obj.read()[:9]) == bytes(9)
    assert int(str(minion.stat()["zeroed_bytes"])) >= zeroed + len("TOPSECRET")
    obj.destroy()


@pytest.mark.parametrize("mode", ["strict", "cooperative"])
def test_a_former_owner_that_kept_its_mapping(shared_dir: Path, unique: Unique, mode: str) -> None:
    """Strict mode truncates the old segment: a cheating former owner faults instead of reading
    what the new owner writes. Cooperative mode documents that it cannot stop such a cheat."""
    directory = shared_dir / mode
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
