"""What a placement policy is (``PlacementPolicy``), the question it answers for each step
(``Choice``), and the two answers every policy builds on: the best worker with room, and a
worker a step is pinned to.

*The best worker* (``Choice.best``): of the live workers with room (``WorkerLoad.has_room``:
late binding, ``placement``), the one with the fewest tasks ahead, CPU breaking ties, plus
what moving the step's largest object to its host would cost (``Route``), in units of the
task's run time; ties broken at random. None while no live worker has room: the step waits
in the scheduler until a report frees a slot.
"""

from __future__ import annotations

import abc
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import ClassVar, Protocol

from orchestrator.scheduler.placement import Link, Route, WorkerLoad
from orchestrator.scheduler.runs import RunState

__all__ = ["Ahead", "Choice", "NextStep", "PlacementPolicy", "pinned"]


@dataclass(frozen=True)
class Choice:
    """One step's placement, as a policy weighs it."""

    workers: Sequence[WorkerLoad]  # those that loaded the step's task module
    task_s: float  # the mean run time of the step's task
    nbytes: int  # the bytes of the objects the step reads
    near: str | None = None  # the worker that holds (or made) the step's largest object
    home: str | None = None  # the worker the run's steps went to so far (``RunState.home``)
    chain: bool = True  # the run's graph is one chain of steps
    avoid: frozenset[str] = frozenset()  # workers that lost this step: only if no other lives
    route: Route = field(default_factory=Route)  # where the largest object is (hosts' costs)
    rng: random.Random = field(default_factory=random.Random)  # breaks ties

    @cached_property
    def alive(self) -> list[WorkerLoad]:
        """The live workers, those in ``avoid`` only when no other lives."""
        fresh = [w for w in self.workers if w.alive and w.worker_id not in self.avoid]
        return fresh or [w for w in self.workers if w.alive]

    def live(self, worker: str | None) -> WorkerLoad | None:
        """``worker``'s load if it is among ``alive``."""
        return next((w for w in self.alive if w.worker_id == worker), None)

    def best(self, *, room: bool = True) -> WorkerLoad | None:
        """The best live worker with room (module docstring); None while none has room.
        ``room=False``: the best live worker, room or not (None while none lives)."""
        free = [w for w in self.alive if not room or w.has_room(self.task_s)]
        if not free:
            return None
        # Load first, as on one host; what reaching a worker's host costs is added in seconds.
        ranked = {w.worker_id: w.score() + self._crossing_s(w) / max(self.task_s, 1e-6)
                  for w in free}  # fmt: skip
        lowest = min(ranked.values())
        return self.rng.choice([w for w in free if ranked[w.worker_id] == lowest])

    def _crossing_s(self, worker: WorkerLoad) -> float:
        crossings = self.route.crossings(worker.host)
        return crossings * (self.route.link or Link()).cost_s(self.nbytes) if crossings else 0.0


def pinned(choice: Choice, worker: str | None) -> str | None:
    """``worker`` while it lives: the step can run nowhere else, so it queues there however
    busy that worker is; else (gone, or none yet) the best worker with room."""
    here = choice.live(worker)
    if here is not None:
        return here.worker_id
    best = choice.best()
    return best.worker_id if best is not None else None


@dataclass(frozen=True)
class NextStep:
    """The step after one being sent, as ``auto`` weighs keeping for it: ``here`` the worker
    the step goes to, ``others`` the other live workers that could run the next one, its
    task's mean run time, the bytes that would move and the way they would go."""

    here: WorkerLoad
    others: Sequence[WorkerLoad]
    task_s: float
    nbytes: int
    route: Route


class Ahead(Protocol):
    """What the dispatcher can tell a policy about the step after one it sends."""

    def may_keep(self) -> bool:
        """Whether the run's plane, its graph and the worker allow the worker to keep what
        the step makes, the next step then pinned to it: the plane hands objects over, the
        run is a chain whose next step alone reads them, and the worker loaded its module."""

    def next_step(self) -> NextStep | None:
        """The next step as ``NextStep`` says; None when it is not one step on its own or the
        worker's load is unknown."""

    def may_hand_on(self) -> bool:
        """Whether the run's plane and graph allow the worker to hand what the step makes
        straight to the next step's worker, that step then pinned there: the plane hands
        objects over, and one step alone reads them (along a chain, or a join's input in a
        graph: ``instructions.sole_reader``)."""

    def next_worker(self, policy: PlacementPolicy) -> str | None:
        """The worker ``policy`` chooses for the next step now, from the loads this step's
        choice saw (its own task not counted: it is done by then), as if the object were
        on the step's worker; when none has room, the least loaded (the next step then
        queues there); a join's worker once the first of its inputs chose it
        (``join_binding``); None when the next step is not one step on its own."""


class PlacementPolicy(abc.ABC):
    """Where a run's steps go: one subclass per ``Policy``, chosen from ``POLICIES``."""

    direct: ClassVar[bool] = False  # a step's worker hands what it makes on (``hands_on``)

    @abc.abstractmethod
    def choose(self, choice: Choice) -> str | None:
        """The worker for the step ``choice`` describes; None while none may take it (the
        step waits until a report frees a slot)."""

    def keeps(self, ahead: Ahead) -> bool:
        """Whether the worker a step goes to keeps what it makes for the next step, which is
        then pinned to it (the object goes neither back to the scheduler nor out again).
        Default: never."""
        return False

    def hands_on(self, ahead: Ahead) -> str | None:
        """The worker a step's worker hands what it makes to when its task is done (the next
        step's, chosen now, and then pinned there: one ownership transfer a step, none when it
        is the step's own worker); None: it comes back to the scheduler. Asked when the worker
        does not keep it. Default: the next step's choice, for a policy that ``hands_on``
        directly; else never."""
        if not self.direct or not ahead.may_hand_on():
            return None
        return ahead.next_worker(self)

    def placed(self, run: RunState, worker: str) -> None:
        """A step of ``run`` went to ``worker``. Default: nothing to remember."""
        return None
