"""``transfer`` (the paper's option 2): every step to the best worker with room. Along a chain
the next step's worker is chosen when a step is sent, by the same rule with the loads as that
choice saw them, and the step's worker hands what it makes straight to it (``hands_on``): one
ownership transfer a step, none when it is the step's own worker, which then keeps it. In a
graph the same holds for a step whose outputs one step alone reads (a join's input; the join's
worker chosen once, by the first of its inputs sent); what several steps read comes back to the
scheduler, which shares it with them."""

from __future__ import annotations

from typing import ClassVar

from orchestrator.scheduler.policies.base import Choice, PlacementPolicy

__all__ = ["Transfer"]


class Transfer(PlacementPolicy):
    """The best worker with room for every step."""

    direct: ClassVar[bool] = True

    def choose(self, choice: Choice) -> str | None:
        best = choice.best()
        return best.worker_id if best is not None else None
