"""A minion with a state folder that is killed and started again finds its objects: bytes,
owners, generations and shares, and the isolation between containers (docs/minion-restart.md).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import cdi
from cdi import protocol
from cdi.auth import ClusterCredentials
from cdi.controller.client import ControllerClient
from cdi.controller.process import ControllerChild
from cdi.errors import ContainerExists
from cdi.minion.launcher import find_binary
from cdi.minion.process import MinionChild
from cdi.minion.state import discard_kept, segment_folder
from tests.cdi.conftest import minion_segment_folder, require_native


class Restartable:
    """A real minion on a socket and state folder, killed and started again by the test."""

    def __init__(self, folder: Path, *args: str) -> None:
        """``args``: more of the minion's options (a controller to report to)."""
        self.socket = str(folder / "minion.sock")
        self.state = str(folder / "state")
        self.args = args
        self.child: MinionChild | None = None
        self.clients: list[cdi.Client] = []

    def start(self) -> None:
        self.child = MinionChild(self.socket, "--state-dir", self.state, *self.args).start()

    def kill(self) -> None:
        assert self.child is not None and self.child.pid is not None
        os.kill(self.child.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while self.child.running and time.monotonic() < deadline:
            time.sleep(0.01)

    def client(self, container_id: str) -> cdi.Client:
        client = cdi.connect(self.socket, container_id)
        self.clients.append(client)
        return client

    def stop(self) -> None:
        for client in self.clients:
            client.close()
        if self.child is not None:
            self.child.stop()


@pytest.fixture
def minion(tmp_path: Path) -> Iterator[Restartable]:
    require_native()
    running = Restartable(tmp_path)
    running.start()
    try:
        yield running
    finally:
        running.stop()  # for good: it frees what a killed one left in /dev/shm too


def test_a_stop_after_a_kill_frees_what_the_minion_kept(minion: Restartable) -> None:
    """A killed minion leaves its memory for its successor; stopping it for good instead
    (``MinionChild.stop``, what the stack and the test fixtures do) removes it."""
    segments = minion_segment_folder(minion.state)
    assert segment_folder(minion.state) == segments  # the minion names it in its state folder
    minion.client("kept").create("kept", 4096).access()[:4] = b"kept"
    minion.kill()
    assert segments.is_dir() and os.listdir(segments)  # kept for a successor
    minion.stop()
    assert not segments.exists()
    assert not os.path.exists(os.path.join(minion.state, "journal"))


def test_objects_owners_shares_and_isolation_survive_a_kill(minion: Restartable) -> None:
    writer = minion.client("writer")
    reader = minion.client("reader")
    former = minion.client("former")
    # "given": written by `former`, given away to `writer` (a strict object: a fresh segment).
    given = former.create("given", 4096, isolation="strict")
    given.access()[:6] = b"handed"
    given.transfer("writer")
    # "shared": the writer's, with a read share held by `reader`.
    shared = writer.create("shared", 10_000, isolation="strict")
    shared.access()[:5] = b"hello"
    shared.share(["reader"])
    assert bytes(reader.use("shared").read()[:5]) == b"hello"
    later = writer.create("later", 100)
    later.access()[:5] = b"later"
    before = {o["key"]: o for o in writer.list_objects()}

    minion.kill()
    minion.start()

    # Every client carries on: its next call registers it again with the new minion.
    after = {o["key"]: o for o in writer.list_objects()}
    assert set(after) == {"given", "shared", "later"}
    # A hand-over to a container not back yet goes through: it finds the object when it is.
    writer.use("later").transfer("reader")
    for key in after:
        for field in ("owner", "generation", "size", "isolation", "readers", "segment"):
            assert after[key][field] == before[key][field], (key, field)
    assert after["shared"]["readers"] == ["reader"]
    assert writer.describe("given")["owner"] == "writer"
    # The bytes are the ones written before the kill.
    assert bytes(writer.use("given").access()[:6]) == b"handed"
    assert bytes(reader.use("shared").read()[:5]) == b"hello"
    # Isolation holds: the former owner cannot map what it gave away; the share still
    # stops the owner's writes until the reader releases it.
    with pytest.raises(cdi.NotOwner):
        former.use("given").access(timeout=0)
    with pytest.raises(cdi.ObjectShared):
        writer.use("shared").access(timeout=0)
    assert reader.use("shared").release()
    view = writer.use("shared").access(timeout=0)
    view[:5] = b"again"
    assert bytes(view[:5]) == b"again"
    # Hand-overs go on as before.
    writer.use("shared").transfer("reader")
    assert bytes(reader.use("shared").access()[:5]) == b"again"
    assert bytes(reader.use("later").access(timeout=0)[:5]) == b"later"
    stat = writer.stat()
    assert stat["objects"] == 3
    assert set(stat["containers"]) >= {"writer", "reader", "former"}


_ORPHAN = """
import sys, time, cdi
client = cdi.connect(sys.argv[1], "orphan")
obj = client.create("orphaned", 100, recovery="keeper")
obj.access()[:3] = b"abc"
print("ready", flush=True)
time.sleep(60)
"""


def test_objects_of_a_container_that_died_meanwhile_go_to_recovery(minion: Restartable) -> None:
    keeper = minion.client("keeper")
    with subprocess.Popen(
        [sys.executable, "-c", _ORPHAN, minion.socket], stdout=subprocess.PIPE, text=True
    ) as orphan:
        try:
            assert orphan.stdout is not None and orphan.stdout.readline().strip() == "ready"
            minion.kill()
        finally:
            orphan.kill()  # dies while no minion runs
            orphan.wait()
    minion.start()
    # The keeper comes back; the orphan never will: its object goes to its recovery container.
    obj = keeper.use("orphaned", check=False)
    assert bytes(obj.access(timeout=10)[:3]) == b"abc"
    assert keeper.describe("orphaned")["owner"] == "keeper"


def test_a_stop_for_good_leaves_nothing_and_a_fresh_minion_is_told_apart(
    minion: Restartable,
) -> None:
    client = minion.client("alone")
    client.create("temp", 100)
    assert minion.child is not None
    minion.child.stop()  # SIGTERM: a stop for good, nothing kept
    assert not os.path.exists(os.path.join(minion.state, "journal"))
    minion.start()
    # The new minion holds other objects (none): the client does not carry on as if it had
    # its object back, it reports the minion lost.
    with pytest.raises(cdi.MinionUnavailable):
        client.use("temp")
    fresh = minion.client("alone-again")
    assert fresh.stat()["objects"] == 0


def test_a_second_minion_on_the_folder_takes_over_from_a_running_one(
    minion: Restartable,
) -> None:
    """An upgrade: the new minion asks the running one to hand over (SIGUSR2), which records
    what it has and stops; clients carry on with the new one."""
    client = minion.client("upgraded")
    obj = client.create("carried", 64)
    obj.access()[:7] = b"carried"
    old = minion.child
    assert old is not None
    minion.start()  # the same socket and state folder
    assert old.wait(10)  # handed over: nobody but its successor told it to stop
    assert old.returncode == 0
    assert client.describe("carried")["owner"] == "upgraded"
    assert bytes(client.use("carried").access()[:7]) == b"carried"
    assert minion.child is not None and minion.child.pid != old.pid


def test_with_term_keeps_a_sigterm_is_a_stop_for_a_restart(tmp_path: Path) -> None:
    """``--term-keeps`` (a container's minion): the SIGTERM a container runtime sends to
    restart a container keeps the objects for the next minion; a stop for good
    (``MinionChild.stop``) still removes them."""
    require_native()
    minion = Restartable(tmp_path, "--term-keeps")
    minion.start()
    try:
        client = minion.client("termed")
        client.create("kept", 64).access()[:4] = b"kept"
        assert minion.child is not None and minion.child.pid is not None
        os.kill(minion.child.pid, signal.SIGTERM)
        assert minion.child.wait(10)
        assert os.path.exists(os.path.join(minion.state, "journal"))
        minion.start()
        assert bytes(client.use("kept").access()[:4]) == b"kept"
    finally:
        minion.stop()
    assert not os.path.exists(os.path.join(minion.state, "journal"))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _eventually(check: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _reported_since(directory: ControllerClient, key: str, since: float) -> bool:
    try:
        return directory.lookup_object(key).updated_at > since
    except cdi.ObjectNotFound:
        return False


def test_the_directory_keeps_an_objects_time_of_creation_across_a_restart(
    tmp_path: Path,
) -> None:
    """The restarted minion announces its objects again with the time each was made, so the
    directory (and the dashboard's ages) do not take the restart for their creation."""
    require_native()
    url = f"grpc://127.0.0.1:{_free_port()}"
    credentials = ClusterCredentials.ensure(tmp_path / "credentials", ["host-a"])
    token = str(credentials.minion_token_file("host-a"))
    with (
        ControllerChild(url, str(tmp_path / "controller.log"), credentials) as controller,
        controller.client() as directory,
    ):
        minion = Restartable(
            tmp_path, "--controller", url, "--host", "host-a", "--controller-token-file", token
        )
        minion.start()
        try:
            made = time.time()
            writer = minion.client("writer")
            writer.create("aged", 100).access()[:4] = b"aged"
            _eventually(lambda: _reported_since(directory, "aged", 0), "the object's report")
            created = directory.lookup_object("aged").created_at
            assert made - 1 < created <= time.time()
            time.sleep(1)  # a time of creation taken at the restart would differ by this much
            killed_at = time.time()
            minion.kill()  # the launcher, which relays the events: the minion hands over
            minion.start()
            # The new launcher's report of the object (its announce of the kept objects).
            _eventually(lambda: _reported_since(directory, "aged", killed_at), "the re-announce")
            again = directory.lookup_object("aged")
            assert (again.created_at, again.owner, again.host) == (created, "writer", "host-a")
            assert bytes(writer.use("aged").access()[:4]) == b"aged"
            writer.use("aged").destroy()
        finally:
            minion.stop()


class Unshared:
    """The minion's binary in a pid namespace of its own (``unshare --pid --fork``), as in a
    container of its own: it cannot see the processes of this test (``SO_PEERCRED`` gives pid
    0), so only a resume token tells it a container came back. Needs root."""

    def __init__(self, folder: Path) -> None:
        self.socket = str(folder / "minion.sock")
        self.state = str(folder / "state")
        self.log = folder / "minion.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        binary = find_binary()
        assert binary is not None
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                ["unshare", "--pid", "--fork", "--kill-child", binary, "--socket", self.socket,
                 "--host", "ns", "--memory-limit", "64000000", "--max-object", "1000000",
                 "--idle-limit", "0", "--isolation", "strict", "--busy-poll-us", "0",
                 "--socket-mode", "666", "--state-dir", self.state,
                 # Long enough for the intruder below to try while the container is expected.
                 "--resume-grace-ms", "60000"],
                stdout=log, stderr=log,
            )  # fmt: skip
        _eventually(self._answers, "the minion to answer")

    def _answers(self) -> bool:
        try:
            cdi.Client(self.socket).close()
        except cdi.MinionUnavailable:
            return False
        return True

    def kill(self) -> None:
        """``kill -9``: unshare dies, its child (the namespace's first process) with it."""
        assert self.process is not None
        self.process.kill()
        self.process.wait()
        _eventually(lambda: not self._answers(), "the minion to die")


_INTRUDER = """
import sys, cdi
try:
    cdi.connect(sys.argv[1], sys.argv[2])
except cdi.CDIError as exc:
    print(type(exc).__name__, exc, flush=True)
else:
    print("registered", flush=True)
"""


def test_a_container_in_another_pid_namespace_comes_back_with_its_token(
    tmp_path: Path,
) -> None:
    """Containers the minion cannot see (pid 0) keep their objects across a ``kill -9`` of the
    minion by their resume tokens; another process of the same uid without the token cannot
    take a name, and a former owner still cannot map what it gave away."""
    if os.geteuid() != 0:
        pytest.skip("unshare --pid needs root")
    require_native()
    minion = Unshared(tmp_path)
    clients: list[cdi.Client] = []
    try:
        minion.start()
        far = cdi.connect(minion.socket, "far")
        former = cdi.connect(minion.socket, "far-former")
        clients += [far, former]
        mine = far.create("mine", 4096)
        mine.access()[:4] = b"mine"
        given = former.create("given", 4096, isolation="strict")
        given.access()[:5] = b"given"
        given.transfer("far")
        tokens = [c._session.conn._resume_token for c in (far, former)]
        assert all(len(token) == 64 for token in tokens) and tokens[0] != tokens[1]

        minion.kill()
        minion.start()

        # Another process of the same uid, without the token: refused while "far" may come
        # back (it counts as ended only when the grace is over).
        intruder = subprocess.run(
            [sys.executable, "-c", _INTRUDER, minion.socket, "far"],
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        assert intruder.stdout.startswith("ContainerExists"), intruder.stdout
        # A wrong token is refused too, and the refusal names no token.
        with cdi.Client(minion.socket) as wrong, pytest.raises(ContainerExists) as refused:
            wrong._session.conn.call(protocol.Op.REGISTER, container="far", resume="0" * 64)
        assert all(token not in str(refused.value) for token in tokens)

        # The containers carry on: their next calls register them again with their tokens.
        assert bytes(far.use("mine").access()[:4]) == b"mine"
        assert bytes(far.use("given").access()[:5]) == b"given"
        assert far.describe("given")["owner"] == "far"
        with pytest.raises(cdi.NotOwner):
            former.use("given").access(timeout=0)
        assert far._session.conn.reconnections == 1
        assert former._session.conn.reconnections == 1
        # They keep their tokens (the minion gives none anew to a container that came back).
        assert [c._session.conn._resume_token for c in (far, former)] == tokens
        # The name stays theirs: a second kill, and they come back again.
        minion.kill()
        minion.start()
        assert bytes(far.use("mine").access()[:4]) == b"mine"
        # No token in the minion's log, nor in its journal (only digests).
        log = minion.log.read_text(errors="replace")
        journal = (Path(minion.state) / "journal").read_bytes()
        for token in tokens:
            assert token not in log
            assert token.encode() not in journal
    finally:
        for client in clients:
            client.close()
        if minion.process is not None:
            minion.kill()
        discard_kept(minion.state)
