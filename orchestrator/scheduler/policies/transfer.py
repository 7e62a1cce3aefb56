"""``transfer`` (the paper's option 2): every step to the best worker with room; what it makes
comes back to the scheduler, which hands it to the next step's worker."""

from __future__ import annotations

from orchestrator.scheduler.policies.base import Choice, PlacementPolicy

__all__ = ["Transfer"]


class Transfer(PlacementPolicy):
    """The best worker with room for every step."""

    def choose(self, choice: Choice) -> str | None:
        best = choice.best()
        return best.worker_id if best is not None else None
