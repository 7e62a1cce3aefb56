"""The scheduler destroys an object of a run it frees without waiting for it in its one loop: an
object still with a worker (on its way back, or lost with its host) is looked at once, without
a wait, and destroyed at a later tick once it is back. Tried with a real minion."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

import cdi
from cdi import ObjectKey
from cdi.minion.process import MinionChild
from orchestrator.scheduler import endings as endings_module
from orchestrator.scheduler.context import SchedulerContext
from orchestrator.scheduler.endings import Endings
from orchestrator.scheduler.minion_link import MinionLink

SCHEDULER = "scheduler-destroys"


class AccessSeen:
    """The scheduler's minion link, noting the timeout of every ``access`` it makes."""

    def __init__(self, link: MinionLink) -> None:
        self.link = link
        self.timeouts: list[float | None] = []

    def use(self, key: str, *, check: bool = True) -> Any:
        handle = self.link.use(key, check=check)
        seen = self

        class Noted:
            def access(self, timeout: float | None = None) -> Any:
                seen.timeouts.append(timeout)
                return handle.access(timeout=timeout)

            def __getattr__(self, name: str) -> Any:
                return getattr(handle, name)

        return Noted()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.link, name)


@pytest.fixture
def minion_socket() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="cdiflow-destroy-") as folder:
        socket = str(Path(folder) / "minion.sock")
        minion = MinionChild(socket).start()
        try:
            yield socket
        finally:
            minion.stop()


def _endings(link: MinionLink | AccessSeen) -> Endings:
    nothing = cast(Any, None)  # destroying objects reads the minion link alone (no dispatch)
    ctx = SchedulerContext(SCHEDULER, nothing, nothing, cast(MinionLink, link), nothing)
    return Endings(ctx, nothing)


def test_an_object_not_back_yet_costs_no_wait_and_goes_once_it_is_back(minion_socket: str) -> None:
    link = MinionLink(minion_socket, SCHEDULER)
    seen = AccessSeen(link)
    endings = _endings(seen)
    try:
        with cdi.connect(minion_socket, "worker-keeps") as worker:
            worker.create("wf-held-1", 64, recovery=SCHEDULER).release()
            # Still the worker's: the loop must not wait for it.
            endings.destroy(ObjectKey("wf-held-1"))
            assert seen.timeouts == [0]
            assert [o["key"] for o in link.list_objects()] == ["wf-held-1"]
            worker.use("wf-held-1").transfer(SCHEDULER)  # handed back
            endings.retry_destroys()  # the next tick
            assert link.list_objects() == []
            assert endings.to_destroy == {}
            assert all(timeout == 0 for timeout in seen.timeouts), seen.timeouts
    finally:
        link.close()


def test_one_that_never_comes_back_is_let_go_for_the_orphan_sweep(
    minion_socket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    link = MinionLink(minion_socket, SCHEDULER)
    endings = _endings(link)
    try:
        with cdi.connect(minion_socket, "worker-keeps") as worker:
            worker.create("wf-held-2", 64).release()
            monkeypatch.setattr(endings_module, "DESTROY_WAIT_S", 0.0)
            endings.destroy(ObjectKey("wf-held-2"))
            endings.retry_destroys()
            assert endings.to_destroy == {}  # no longer looked for at every tick
            assert [o["key"] for o in link.list_objects()] == ["wf-held-2"]
            worker.use("wf-held-2").destroy()
        endings.destroy(ObjectKey("wf-never-made"))  # one host, no such object: nothing to look for
        assert endings.to_destroy == {}
    finally:
        link.close()
