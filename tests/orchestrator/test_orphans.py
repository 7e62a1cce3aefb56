"""The scheduler's sweep of objects nothing names, on a small fake of its context (the minion
and the controller's directory as lists, Postgres's statuses as a dict), read through the
``ObjectDirectory``: one kept by a worker on another host is asked back like one on ours; one
in a gateway's hands (in transit) is left alone."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import cdi
from cdi import ObjectKey
from orchestrator.contract.vocabulary import WorkflowStatus
from orchestrator.scheduler.object_directory import ObjectDirectory
from orchestrator.scheduler.orphans import OrphanObjects


@dataclass
class _Link:
    here: list[dict[str, Any]] = field(default_factory=list)
    elsewhere: list[dict[str, Any]] = field(default_factory=list)
    directory_up: bool = True
    host: str = "host1"

    def list_objects(self) -> list[dict[str, Any]]:
        return self.here


@dataclass
class _Controller:
    """The CDI controller's directory, as the link's lists say (two live hosts)."""

    link: _Link

    def list_minions(self) -> list[SimpleNamespace]:
        self._answers()
        return [SimpleNamespace(host=h, alive=True) for h in ("host1", "host2")]

    def list_objects(self) -> list[SimpleNamespace]:
        self._answers()
        return [SimpleNamespace(**o) for o in self.link.elsewhere]

    def _answers(self) -> None:
        if not self.link.directory_up:
            raise cdi.ControllerUnavailable("the controller does not answer")


@dataclass
class _Db:
    ended: set[uuid.UUID]

    def statuses(self, ids: set[uuid.UUID]) -> dict[uuid.UUID, WorkflowStatus]:
        return {
            i: WorkflowStatus.COMPLETED if i in self.ended else WorkflowStatus.RUNNING for i in ids
        }


@dataclass
class _Ctx:
    cdi: _Link
    db: _Db
    id: str = "scheduler-1"
    runs: dict[uuid.UUID, Any] = field(default_factory=dict)


@dataclass
class _Endings:
    asked: list[tuple[str, str, str]] = field(default_factory=list)
    destroyed: list[str] = field(default_factory=list)

    def ask_back(self, workflow_id: str, worker: str, key: str = "") -> None:
        self.asked.append((workflow_id, worker, key))

    def destroy(self, key: str) -> None:
        self.destroyed.append(key)


def _sweeper(link: _Link, ended: uuid.UUID) -> tuple[OrphanObjects, _Endings]:
    endings = _Endings()
    directory = ObjectDirectory(link, _Controller(link))  # type: ignore[arg-type]
    sweeper = OrphanObjects(_Ctx(link, _Db({ended})), endings, directory)  # type: ignore[arg-type]
    # The sweep runs once a run used objects, or with suspects.
    sweeper._suspects = {ObjectKey("seen")}
    return sweeper, endings


def test_an_object_a_worker_on_another_host_kept_is_asked_back() -> None:
    ended = uuid.uuid4()
    left = f"wf-{ended}-ab12cd-1"
    link = _Link(
        elsewhere=[
            {"key": left, "owner": "worker-2", "host": "host2"},
            {"key": f"wf-{ended}-ab12cd-2", "owner": "cdi-gateway.host2.in-1", "host": "host2"},
        ]
    )
    sweeper, endings = _sweeper(link, ended)
    sweeper.sweep()
    assert endings.asked == []  # once is not enough: it may be in transit
    sweeper.sweep()
    assert endings.asked == [(str(ended), "worker-2", left)]  # the gateway's copy is not
    assert endings.destroyed == []


def test_a_controller_away_leaves_our_own_host_swept() -> None:
    ended = uuid.uuid4()
    mine = f"wf-{ended}-ab12cd-1"
    link = _Link(here=[{"key": mine, "owner": "scheduler-1"}], directory_up=False)
    sweeper, endings = _sweeper(link, ended)
    sweeper.sweep()
    sweeper.sweep()
    assert endings.destroyed == [mine]
