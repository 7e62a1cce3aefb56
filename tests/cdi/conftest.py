"""Fixtures that run a real minion process for the CDI tests."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import cdi
from cdi.client.connection import NATIVE_ENV, native_built
from cdi.minion import launcher
from cdi.minion.process import MinionChild

ROOT = Path(__file__).resolve().parents[2]

# Processes the tests run under other uids (tests/cdi/actors.py): their container ids are
# reserved for them by the minions' --names rules, and they join the sockets' group.
OWNER_UID, INTRUDER_UID, OUTSIDER_UID = 1001, 1002, 1003
SOCKET_GROUP = 1100


def as_uid(uid: int, name: str) -> str:
    """A container id the test minions reserve for ``uid``."""
    return f"uid{uid}-{name}"


TEST_NAMES = ",".join(f"{as_uid(uid, '*')}={uid}" for uid in (OWNER_UID, INTRUDER_UID))


@dataclass
class MinionProcess:
    child: MinionChild
    clients: list[cdi.Client] = field(default_factory=list)

    @property
    def socket_path(self) -> str:
        return self.child.socket_path

    @property
    def pid(self) -> int:
        return self.child.pid

    def client(self, container_id: str | None = None, **kwargs: object) -> cdi.Client:
        client = cdi.connect(self.socket_path, container_id, **kwargs)  # type: ignore[arg-type]
        self.clients.append(client)
        return client

    def stat(self) -> dict[str, Any]:
        with cdi.Client(self.socket_path) as probe:
            return probe.stat()


REQUIRE_NATIVE = "CDI_REQUIRE_NATIVE"


def require_native() -> None:
    """Skip (locally, with the reason) or fail (where ``$CDI_REQUIRE_NATIVE`` is set, as CI
    sets it) when the minion's binary is not installed."""
    if launcher.find_binary() is not None:
        return
    reason = launcher.missing_binary()
    if os.environ.get(REQUIRE_NATIVE):
        pytest.fail(f"{reason} (${REQUIRE_NATIVE} is set: CI needs it)", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(params=["native", "python"])
def client_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test of a module that uses this twice: its clients (in this process and in the
    actors it starts) with ``transfer`` and ``access`` in the native extension, then in Python.
    Without the extension the native run is skipped, or fails where ``$CDI_REQUIRE_NATIVE`` is
    set (``make`` builds it wherever it builds the minion)."""
    if request.param == "native":
        require_client_native()
    monkeypatch.setenv(NATIVE_ENV, "1" if request.param == "native" else "0")
    return str(request.param)


def require_client_native() -> None:
    """Skip, or fail where ``$CDI_REQUIRE_NATIVE`` is set, without the client's extension."""
    if native_built():
        return
    reason = "the client's native hot path (cdi._hotpath) is not built"
    if os.environ.get(REQUIRE_NATIVE):
        pytest.fail(f"{reason} (${REQUIRE_NATIVE} is set: CI needs it)", pytrace=False)
    pytest.skip(reason)


def minion_segment_folder(state_dir: str | Path) -> Path:
    """Where the minion of ``state_dir`` keeps its segment files: ``/dev/shm/cdi-minion-<uid>-
    <FNV-1a of the folder's path>`` (``resume.rs``), worked out here on its own so that a test
    finds a folder the minion did not record."""
    digest = 0xCBF29CE484222325
    for byte in os.fsencode(os.path.abspath(state_dir)):
        digest = ((digest ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return Path(f"/dev/shm/cdi-minion-{os.geteuid()}-{digest:016x}")


def start_minion(directory: Path, *extra: str) -> MinionProcess:
    """Start a real minion with its socket in ``directory``; wait until it answers. Ids
    ``uid1001-*``, ``uid1002-*`` are those uids'; as root (who may give the socket any group),
    the socket belongs to ``SOCKET_GROUP``, which the actors under those uids join."""
    require_native()
    access: tuple[str, ...] = ("--names", TEST_NAMES)
    if os.geteuid() == 0:
        access += ("--socket-group", str(SOCKET_GROUP))
    return MinionProcess(MinionChild(str(directory / "minion.sock"), *access, *extra).start())


def stop_minion(minion: MinionProcess) -> None:
    for client in minion.clients:
        client.close()
    minion.child.stop()


@pytest.fixture(scope="module")
def shared_dir() -> Iterator[Path]:
    """A temp folder other uids can traverse (pytest's own tmp folders are 0700); one per
    module."""
    with tempfile.TemporaryDirectory(prefix="cdi-test-") as name:
        os.chmod(name, 0o755)
        yield Path(name)


@pytest.fixture(scope="module")
def minion(shared_dir: Path) -> Iterator[MinionProcess]:
    """One real minion per test module; at the end nothing may be left in it."""
    running = start_minion(shared_dir)
    try:
        yield running
        for client in running.clients:
            client.close()
        running.clients.clear()
        # Objects of closed clients are reclaimed: no object and no segment may be left.
        deadline = time.monotonic() + 5
        stat = running.stat()
        while (stat["objects"] or stat["used_segments"]) and time.monotonic() < deadline:
            time.sleep(0.05)
            stat = running.stat()
        assert stat["objects"] == 0, f"objects leaked: {stat}"
        assert stat["used_segments"] == 0, f"segments leaked: {stat}"
    finally:
        stop_minion(running)
    assert not os.path.exists(running.socket_path), "the minion left its socket behind"


@pytest.fixture
def unique() -> Callable[[str], str]:
    """Unique keys/ids per test, so tests sharing a minion never collide."""
    counter = iter(range(1_000_000))
    stamp = f"{os.getpid()}-{time.monotonic_ns()}"
    return lambda prefix: f"{prefix}-{stamp}-{next(counter)}"
