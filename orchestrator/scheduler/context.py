"""What every part of one scheduler works with."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import redis

from orchestrator.contract import keys
from orchestrator.db.scheduler_store import SchedulerStore
from orchestrator.objectstore import ObjectStore
from orchestrator.scheduler.guarded import Faults, guarded
from orchestrator.scheduler.minion_link import MinionLink
from orchestrator.scheduler.runs import RunState

__all__ = ["NextTick", "SchedulerContext", "Turn"]


@dataclass
class NextTick:
    """When the loop's next tick is due (monotonic). A collaborator that needs it sooner (a
    retry falls due, a run reaches its deadline, a schedule fires) brings it forward."""

    at: float = 0.0

    def by(self, moment: float) -> None:
        """Make the tick come no later than ``moment``."""
        self.at = min(self.at, moment)


@dataclass
class Turn:
    """What a loop turn lets be seen outside the scheduler only once its writes are committed
    (``SchedulerStore.end_turn``): a run's end announced, the reports it read trimmed, the
    objects it freed destroyed. Outside a turn (a test driving one part by hand) an action
    runs at once, its statements having been committed one by one.

    The runs a turn ends are written in the turn's transaction with everything else it
    writes (the reports, the next steps, the claims of the runs waiting), and told together
    after its one commit. The loop's tick is the exception: a turn that has an end to tell
    commits before the tick's housekeeping (``commit_if_told``, through ``commit``, which the
    loop sets), so no end waits for it; that is one commit more a second at most."""

    open: bool = False
    commit: Callable[[], None] | None = None  # commit now and go on (the loop's)
    _told: bool = False
    _committed: list[Callable[[], None]] = field(default_factory=list)
    _ended: list[Callable[[], None]] = field(default_factory=list)

    def tell(self, action: Callable[[], None]) -> None:
        """``later``, for what a client waits for (an end's announcement)."""
        self.later(action)
        self._told = self.open

    def commit_if_told(self) -> None:
        """Commit now if something the turn wrote is waited for (``tell``)."""
        if self._told and self.commit is not None:
            self.commit()

    def later(self, action: Callable[[], None], *, even_if_rolled_back: bool = False) -> None:
        """Run ``action`` after the turn's commit; if the turn's writes were lost (rolled
        back: the tick then resyncs with Postgres), only if ``even_if_rolled_back``."""
        if not self.open:
            action()
        elif even_if_rolled_back:
            self._ended.append(action)
        else:
            self._committed.append(action)

    def begin(self) -> None:
        self.open, self._told = True, False

    def drop(self) -> None:
        """The turn is abandoned (its process is ending): nothing that waited runs."""
        self.open, self._told = False, False
        self._committed, self._ended = [], []

    def end(self, committed: bool, faults: Faults) -> None:
        """The turn is over (``committed``: its writes are in Postgres): run what waited."""
        self.open, self._told = False, False
        actions = (self._committed if committed else []) + self._ended
        self._committed, self._ended = [], []
        for action in actions:
            guarded(action, faults)


@dataclass(frozen=True)
class SchedulerContext:
    """One scheduler's identity, connections and runs, shared by its loop's collaborators.

    ``id`` is also its CDI container id (the recovery container of the runs' objects);
    ``runs`` holds the workflows it runs, by id, and only the loop thread touches it;
    ``faults`` what steps that raised said about Postgres and the minion (``guarded``);
    ``tick`` when the loop's next tick is due; ``turn`` what waits for the loop turn's
    commit.
    """

    id: str
    db: SchedulerStore
    redis: redis.Redis
    cdi: MinionLink
    objects: ObjectStore  # where results and object-store images go in S3
    runs: dict[uuid.UUID, RunState] = field(default_factory=dict)
    faults: Faults = field(default_factory=Faults)
    tick: NextTick = field(default_factory=NextTick)
    turn: Turn = field(default_factory=Turn)

    @property
    def reply_key(self) -> str:
        """The list workers push this scheduler's reports onto."""
        return keys.scheduler_reports_key(self.id)

    @property
    def taken_key(self) -> str:
        """Where the loop moves the reports it takes for its turn (``Reports.take``)."""
        return keys.reports_taken_key(self.reply_key)
