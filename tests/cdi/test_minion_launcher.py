"""The Python side of the minion: its arguments, its event relay, finding its binary.

The binary itself is tested by every other module here; these are unit tests of the launcher,
with a recording reporter in place of the controller.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import msgpack
import psutil
import pytest

import cdi
from cdi.controller.models import Restarts
from cdi.minion import launcher
from cdi.minion.config import MinionConfig
from cdi.minion.names import parse_names
from cdi.minion.process import MinionChild
from cdi.protocol import Isolation
from tests.cdi.conftest import require_native


class RecordingReporter:
    def __init__(self) -> None:
        self.calls: list[tuple[object, ...]] = []

    def container_registered(self, container_id: str, pid: int, uid: int) -> None:
        self.calls.append(("registered", container_id, pid, uid))

    def container_gone(self, container_id: str) -> None:
        self.calls.append(("gone", container_id))

    def object_changed(
        self, key: str, size: int, owner: str, generation: int, created_at: float = 0.0
    ) -> None:
        self.calls.append(("changed", key, size, owner, generation, created_at))

    def object_removed(self, key: str) -> None:
        self.calls.append(("removed", key))

    def store_resumed(self, restarts: Restarts) -> None:
        self.calls.append(("store", restarts))

    def close(self) -> None:
        self.calls.append(("closed",))


def _chunks(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def _reader(pieces: list[bytes]) -> Callable[[int], bytes]:
    """A pipe's ``read`` that returns ``pieces`` one by one."""
    feed = iter(pieces)
    return lambda _n: next(feed)


def test_events_reach_the_reporter_whatever_the_pipe_splits() -> None:
    events: list[list[object]] = [
        ["registered", "a", 10, 0],
        ["changed", "k", 4096, "a", 1, 1_700_000_000.5],
        ["changed", "k", 4096, "b", 2, 1_700_000_000.5],
        ["removed", "k"],
        ["gone", "a"],
    ]
    # A "changed" without its time of creation (five items) is taken too: 0, unknown.
    older = ["changed", "o", 1, "a", 1]
    stream = b"".join(msgpack.packb(e) for e in [["store", "s-1", 2, 5], *events, older])
    for size in (1, 3, 7, len(stream)):
        reporter = RecordingReporter()
        launcher.relay_events(_reader([*_chunks(stream, size), b""]), reporter)
        # The store: a state folder (an id), the restarts and the objects kept.
        assert reporter.calls[0] == ("store", Restarts(True, 2, 5)), size
        assert reporter.calls[1:-1] == [tuple(e) for e in events], size
        assert reporter.calls[-1] == (*older, 0.0), size


def test_a_malformed_event_is_logged_and_skipped(caplog: pytest.LogCaptureFixture) -> None:
    stream = b"".join(
        msgpack.packb(e)
        for e in (["exploded", 1], "not an array", ["gone"], ["removed", "bad key!"], ["gone", "a"])
    )
    reporter = RecordingReporter()
    launcher.relay_events(_reader([stream, b""]), reporter)
    assert reporter.calls == [("removed", "bad key!"), ("gone", "a")]
    assert caplog.text.count("ignoring a malformed minion event") == 3


def test_argv_carries_the_resolved_config(tmp_path: Path) -> None:
    config = MinionConfig(
        socket_path=str(tmp_path / "m.sock"),
        host="h1",
        memory_limit=1 << 30,
        max_object=1 << 20,
        isolation=Isolation.STRICT,
        prewarm={4096: 2, 1_000_000: 1},
        busy_poll_us=0,
        socket_group=1100,
        names=parse_names("worker-*=1001,sched=0"),
        state_dir="state",
    )
    argv = launcher.binary_argv("/bin/cdi-minion", config)
    pairs = dict(zip(argv[1::2], argv[2::2], strict=True))
    assert pairs == {
        "--socket": str(tmp_path / "m.sock"),
        "--host": "h1",
        "--memory-limit": str(1 << 30),
        "--max-object": str(1 << 20),
        "--idle-limit": str((1 << 30) // 4),
        "--isolation": "strict",
        "--busy-poll-us": "0",
        "--socket-mode": "660",
        "--socket-group": "1100",
        "--names": "worker-*=1001,sched=0",
        "--prewarm": "4096:2,1000000:1",
        "--state-dir": os.path.abspath("state"),
    }


def test_asking_for_a_missing_binary_is_a_clear_usage_error(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "cdi.minion", "--socket", str(tmp_path / "s")],
        env={"CDI_MINION_BIN": str(tmp_path / "nowhere"), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "is not an executable file" in result.stderr
    assert not (tmp_path / "s").exists()


def test_the_binary_stops_when_its_relay_dies(tmp_path: Path) -> None:
    """With a controller, a Python parent relays events; if it is killed, the minion goes too
    (and removes its socket) instead of serving on as an orphan nobody reports for."""
    require_native()
    socket_path = tmp_path / "m.sock"
    relay = subprocess.Popen(
        [sys.executable, "-m", "cdi.minion", "--socket", str(socket_path),
         "--controller", "grpc://127.0.0.1:1"],  # nobody answers there: the reporter retries
        env={**os.environ, "CDI_CONTROLLER_TOKEN": "cdi1.minion.vm.unchecked-here"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    minion: psutil.Process | None = None
    try:
        deadline = time.monotonic() + 20
        while not socket_path.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert socket_path.exists(), "the minion did not start"
        children = Path(f"/proc/{relay.pid}/task/{relay.pid}/children").read_text().split()
        assert len(children) == 1
        minion = psutil.Process(int(children[0]))
        assert minion.name() == launcher.BINARY_NAME
        relay.kill()
        relay.wait(10)
        minion.wait(10)  # raises TimeoutExpired if the minion outlives its relay
        assert not socket_path.exists()
    finally:
        if relay.poll() is None:
            relay.kill()
            relay.wait()
        if minion is not None and minion.is_running():
            minion.terminate()  # the test failed: leave no orphan behind
            minion.wait(10)


def test_with_a_state_folder_the_binary_keeps_its_objects_when_its_relay_dies(
    tmp_path: Path,
) -> None:
    """The relay's death is a restart (its supervisor starts another): the binary serves on
    until its successor takes the folder over, or a few seconds, then stops and leaves its
    journal for the next minion of the folder (docs/minion-restart.md)."""
    require_native()
    socket_path, state = tmp_path / "m.sock", tmp_path / "state"
    relay = subprocess.Popen(
        [sys.executable, "-m", "cdi.minion", "--socket", str(socket_path),
         "--controller", "grpc://127.0.0.1:1", "--state-dir", str(state)],
        env={**os.environ, "CDI_CONTROLLER_TOKEN": "cdi1.minion.vm.unchecked-here"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    minion: psutil.Process | None = None
    try:
        deadline = time.monotonic() + 20
        while not socket_path.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert socket_path.exists(), "the minion did not start"
        with cdi.connect(str(socket_path), "kept") as client:
            client.create("kept", 100).access()[:4] = b"kept"
            children = Path(f"/proc/{relay.pid}/task/{relay.pid}/children").read_text().split()
            minion = psutil.Process(int(children[0]))
            relay.kill()
            relay.wait(10)
            time.sleep(0.2)
            assert client.stat()["objects"] == 1  # served on without its relay
            minion.wait(15)  # --successor-wait-ms (5 s) without a successor
        assert (state / "journal").exists()
    finally:
        if relay.poll() is None:
            relay.kill()
            relay.wait()
        if minion is not None and minion.is_running():
            minion.terminate()
            minion.wait(10)
    # The next minion of the folder has the object; stopped for good, it frees it all.
    again = MinionChild(str(socket_path), "--state-dir", str(state))
    with again, cdi.connect(again.socket_path, "other") as probe:
        assert probe.stat()["objects"] == 1
    assert not (state / "journal").exists()
