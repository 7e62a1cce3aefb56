"""The client's hot path in its native extension (``cdi._hotpath``): it is what runs when it is
built, and it fails as the Python path fails, with the same exceptions and messages."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import cdi
from cdi.client import connection
from cdi.client.connection import MinionConnection
from cdi.errors import ConfigError, MinionUnavailable
from cdi.protocol import Op
from tests.cdi.conftest import MinionProcess, require_client_native, start_minion, stop_minion

Unique = Callable[[str], str]


@pytest.fixture(autouse=True)
def _native_built() -> None:
    require_client_native()


def _python_path_broken(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the Python path's send and receive fail: only the native path can still move."""

    def broken(*args: object, **kwargs: object) -> Any:
        raise AssertionError("the Python path ran")

    monkeypatch.setattr(MinionConnection, "_send", broken)
    monkeypatch.setattr(MinionConnection, "_next_reply", broken)


def _hand_off_and_back(obj: cdi.CDIObject, theirs: cdi.CDIObject, to: str, back: str) -> bytes:
    obj.transfer(to)
    data = bytes(theirs.access(timeout=5)[:4])
    theirs.transfer(back)
    obj.access(timeout=5).release()
    return data


@pytest.mark.parametrize("native", [True, False])
def test_the_extension_is_what_runs_when_present(
    minion: MinionProcess, unique: Unique, monkeypatch: pytest.MonkeyPatch, native: bool
) -> None:
    """With the Python path's send and receive broken, a hand-off (``transfer``, then
    ``access`` of a grant, each way) still completes through the extension, and fails
    without it."""
    sender = minion.client(unique("tx"), native=native, spin_us=0)
    receiver = minion.client(unique("rx"), native=native, spin_us=0)
    key = unique("obj")
    obj = sender.create(key, 4096)
    obj.write(b"abcd")
    theirs = receiver.use(key, check=False)
    ids = (receiver.container_id or "", sender.container_id or "")
    _python_path_broken(monkeypatch)
    if native:
        assert _hand_off_and_back(obj, theirs, *ids) == b"abcd"
        assert _hand_off_and_back(obj, theirs, *ids) == b"abcd"
    else:
        with pytest.raises(AssertionError, match="the Python path ran"):
            _hand_off_and_back(obj, theirs, *ids)


def _failures(socket_path: str, native: bool, tag: str) -> list[tuple[str, str]]:
    """What each way a hot operation can fail raises: class and message (``tag`` stands for
    the names, which differ between runs)."""
    owner = cdi.connect(socket_path, f"{tag}-owner", native=native)
    other = cdi.connect(socket_path, f"{tag}-other", native=native)
    owner.create(f"{tag}-key", 4096)
    attempts: list[Callable[[], object]] = [
        lambda: other.use(f"{tag}-key").transfer(f"{tag}-owner"),  # not ours
        lambda: owner.use(f"{tag}-key").transfer(f"{tag}-nobody"),  # no such container
        lambda: other.use(f"{tag}-key").access(timeout=0),  # not ours, no wait
        lambda: other.use(f"{tag}-key").access(timeout=0.05),  # not ours within the time
        lambda: other.use(f"{tag}-key", check=False).access(timeout=0.05).release(),  # again
        lambda: other.use(f"{tag}-gone", check=False).access(timeout=5),  # no such key
    ]
    seen = []
    for attempt in attempts:
        with pytest.raises(cdi.CDIError) as caught:
            attempt()
        seen.append((type(caught.value).__name__, str(caught.value).replace(tag, "<tag>")))
    owner.close()
    other.close()
    return seen


def test_a_failure_raises_the_same_exception_on_both_paths(
    minion: MinionProcess, unique: Unique
) -> None:
    native = _failures(minion.socket_path, True, unique("n"))
    python = _failures(minion.socket_path, False, unique("p"))
    assert native == python
    assert [name for name, _ in native] == [
        "NotOwner", "UnknownContainer", "NotOwner", "AccessTimeout", "AccessTimeout",
        "ObjectNotFound",
    ]  # fmt: skip


def _lost(directory: Path, native: bool) -> list[tuple[str, str]]:
    """A registered connection whose minion stops: what ``transfer`` and ``access`` raise."""
    running = start_minion(directory)
    conns = [MinionConnection(running.socket_path, 5.0, reconnect_s=0, native=native)]
    conns.append(MinionConnection(running.socket_path, 5.0, reconnect_s=0, native=native))
    conns[0].register("lost-a")
    conns[1].register("lost-b")
    conns[0].call(Op.CREATE, key="lost-key", size=10)
    stop_minion(running)
    seen = []
    calls: list[Callable[[], object]] = [
        lambda: conns[0].call(Op.TRANSFER, key="lost-key", to="lost-b"),
        lambda: conns[1].call_blocking(Op.ACCESS, 1.0, key="lost-key"),
    ]
    for call in calls:
        with pytest.raises(MinionUnavailable) as caught:
            call()
        seen.append((type(caught.value).__name__, str(caught.value).replace(str(directory), "")))
    for conn in conns:
        conn.close()
    return seen


def test_a_lost_minion_is_reported_alike_on_both_paths(shared_dir: Path) -> None:
    (shared_dir / "lost-native").mkdir()
    (shared_dir / "lost-python").mkdir()
    native = _lost(shared_dir / "lost-native", True)
    assert native == _lost(shared_dir / "lost-python", False)
    assert all(name == "MinionUnavailable" for name, _ in native)


def test_without_the_extension_the_python_path_runs(
    minion: MinionProcess, unique: Unique, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(connection, "Wire", None)
    with pytest.raises(ConfigError, match="not built"):
        MinionConnection(minion.socket_path, 5.0, native=True)
    client = minion.client(unique("plain"))
    assert not client._session.conn.native
    obj = client.create(unique("obj"), 10)
    obj.transfer(client.container_id or "")
    assert obj.access(timeout=0).nbytes == 10


def test_the_environment_chooses_the_path(
    minion: MinionProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    chosen = []
    for value, native in (("0", None), ("1", None), ("1", False)):
        monkeypatch.setenv(connection.NATIVE_ENV, value)
        conn = MinionConnection(minion.socket_path, 5.0, native=native)
        chosen.append(conn.native)
        conn.close()
    assert chosen == [False, True, False]


def test_the_native_reads_of_view_counts_agree_with_ctypes(monkeypatch: pytest.MonkeyPatch) -> None:
    """``exports.views_in_use`` and ``exports_of`` read the same counts natively as through
    ``ctypes``: a held view, one released, a slice or NumPy array still holding the memory."""
    import mmap

    import numpy as np

    from cdi.client import exports

    assert exports._NATIVE  # what the client uses here
    mm = mmap.mmap(-1, mmap.PAGESIZE)
    base = memoryview(mm)
    view = base[:100]
    handed = [(view, base)]
    states = []

    def both() -> None:
        native = (exports.views_in_use(handed), exports.exports_of(mm))
        with monkeypatch.context() as patched:
            patched.setattr(exports, "_NATIVE", False)
            assert (exports.views_in_use(handed), exports.exports_of(mm)) == native
        states.append(native)

    both()  # held by us alone
    part = view[10:]
    both()  # a slice of it held
    part.release()
    array = np.frombuffer(view, dtype=np.uint8)
    both()  # a NumPy array over it
    del array
    view.release()
    both()  # released by the caller
    extra = base[:5]
    both()  # released, and another slice of the memory held
    extra.release()
    base.release()
    both()  # every view released: the mapping exports nothing
    mm.close()
    assert states == [(False, 1), (True, 1), (True, 1), (False, 1), (True, 1), (False, 0)]
