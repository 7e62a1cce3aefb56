"""What every part of one scheduler works with."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

import redis

from orchestrator.contract import keys
from orchestrator.db.scheduler_store import SchedulerStore
from orchestrator.objectstore import ObjectStore
from orchestrator.scheduler.guarded import Faults
from orchestrator.scheduler.minion_link import MinionLink
from orchestrator.scheduler.runs import RunState

__all__ = ["NextTick", "SchedulerContext"]


@dataclass
class NextTick:
    """When the loop's next tick is due (monotonic). A collaborator that needs it sooner (a
    retry falls due, a run reaches its deadline, a schedule fires) brings it forward."""

    at: float = 0.0

    def by(self, moment: float) -> None:
        """Make the tick come no later than ``moment``."""
        self.at = min(self.at, moment)


@dataclass(frozen=True)
class SchedulerContext:
    """One scheduler's identity, connections and runs, shared by its loop's collaborators.

    ``id`` is also its CDI container id (the recovery container of the runs' objects);
    ``runs`` holds the workflows it runs, by id, and only the loop thread touches it;
    ``faults`` what steps that raised said about Postgres and the minion (``guarded``);
    ``tick`` when the loop's next tick is due.
    """

    id: str
    db: SchedulerStore
    redis: redis.Redis
    cdi: MinionLink
    objects: ObjectStore  # where results and object-store images go in S3
    runs: dict[uuid.UUID, RunState] = field(default_factory=dict)
    faults: Faults = field(default_factory=Faults)
    tick: NextTick = field(default_factory=NextTick)

    @property
    def reply_key(self) -> str:
        """The list workers push this scheduler's reports onto."""
        return keys.scheduler_reports_key(self.id)
