"""What the scheduler's loop waits for when it asks whether a silent worker's step got its
objects back (``CdiPlane.regain``), on a small fake of its CDI link (a host cut off or killed
made it stand still for 10 s and more): an object the directory places on the worker's host
(held there, or that host is cut off) is not waited for, the next tick asks again; one no host
has is gone; one here is looked at as before. (Destroying one that is not back without waiting:
``test_scheduler_destroy``.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from cdi import ObjectKey
from orchestrator.contract.messages import Instruction
from orchestrator.contract.vocabulary import DataPlane
from orchestrator.scheduler.data import Mode
from orchestrator.scheduler.object_directory import controller_from_env
from orchestrator.scheduler.planes.cdi import CdiPlane


class _Waited(AssertionError):
    """The fake's way of saying the loop would have waited on the object."""


@dataclass
class _Link:
    directory: dict[str, str] = field(default_factory=dict)  # key -> host
    here: list[str] = field(default_factory=list)
    host: str = "host1"
    waited: list[str] = field(default_factory=list)

    def list_objects(self) -> list[dict[str, Any]]:
        return [{"key": k} for k in self.here]

    def located(self, key: str) -> str | None:
        return self.directory.get(key)

    def use(self, key: str, *, check: bool = True) -> Any:
        if check:  # the client would ask the other hosts, waiting for their directory
            raise _Waited(f"{key} looked up on every host")
        return _Handle(key, self)


@dataclass
class _Handle:
    key: str
    link: _Link

    def view(self, timeout: float | None = None) -> Any:
        self.link.waited.append(self.key)
        raise _Waited(self.key)

    def access(self, timeout: float | None = None) -> Any:
        self.link.waited.append(self.key)
        raise _Waited(self.key)


def _regain(link: _Link) -> bool:
    ctx = SimpleNamespace(cdi=link, id="scheduler-1")
    instruction = Instruction(
        task_run_id=7, workflow_id="w", ref="b", task="m:t", attempt=1, timeout_s=30,
        reply_to="r", data_plane=DataPlane.CDI, key=ObjectKey("k1"),
    )  # fmt: skip
    run = SimpleNamespace(data_plane=DataPlane.CDI, objects={})
    step = SimpleNamespace(modes={"k1": Mode.OWN})
    flight = SimpleNamespace(instruction=instruction, worker="worker-2")
    dropped: list[str] = []
    return CdiPlane().regain(ctx, run, step, flight, dropped.append)  # type: ignore[arg-type]


def test_an_object_on_the_silent_workers_host_is_not_waited_for() -> None:
    link = _Link(directory={"k1": "host2"})
    assert _regain(link) is False  # still held there: ask again at the next tick
    assert link.waited == []


def test_an_object_no_host_has_is_gone() -> None:
    link = _Link()
    assert _regain(link) is True
    assert link.waited == []


def test_an_object_here_is_looked_at() -> None:
    link = _Link(here=["k1"], directory={"k1": "host1"})
    with pytest.raises(_Waited):
        _regain(link)
    assert link.waited == ["k1"]


def test_the_directory_is_asked_only_with_a_token_to_read_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without a reader's token every question would be refused, and a silent worker's step,
    its object "not known yet", would wait for ever: the scheduler then looks on its own host."""
    monkeypatch.setenv("CDI_CONTROLLER_URL", "grpc://127.0.0.1:1")
    monkeypatch.delenv("CDI_CONTROLLER_TOKEN", raising=False)
    monkeypatch.delenv("CDI_CONTROLLER_TOKEN_FILE", raising=False)
    assert controller_from_env() is None
    monkeypatch.setenv("CDI_CONTROLLER_TOKEN", "cdi1.reader.scheduler.mac")
    directory = controller_from_env()
    assert directory is not None
    directory.close()
