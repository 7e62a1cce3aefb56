"""``affinity`` (the paper's option 1): the first step goes to the best worker with room, and
every later step of the run to that same worker (its home), which keeps the CDI object between
steps. A step pinned there is not held back for room: it can run nowhere else, so it queues.

*Why only along a chain:* pinning a graph's steps to one worker would run its parallel branches
one after another; beyond a chain each step goes to the best worker, as under ``transfer``, so
branches start together."""

from __future__ import annotations

from orchestrator.scheduler.policies.base import Ahead, Choice, PlacementPolicy, pinned
from orchestrator.scheduler.runs import RunState

__all__ = ["Affinity"]


class Affinity(PlacementPolicy):
    """Every step of a chain on the run's home worker, which keeps what each makes."""

    def choose(self, choice: Choice) -> str | None:
        return pinned(choice, choice.home if choice.chain else None)

    def keeps(self, ahead: Ahead) -> bool:
        return ahead.may_keep()

    def placed(self, run: RunState, worker: str) -> None:
        run.home = run.home or worker  # gone with its worker: ``recovery`` clears it
