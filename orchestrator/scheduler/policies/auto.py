"""``auto``: a step stays on the worker that holds its largest object unless waiting there
costs more than moving to the best worker with room (``stays``).

Expected wait = tasks ahead (queued + running + in flight) x the mean run time of the step's
task; moving costs two hand-offs plus the bytes at memory bandwidth (an allowance for caches
gone cold; zero-copy on one host), and for every host boundary the object crosses on its way
(``Route``: straight from worker to worker when handed on, else through the scheduler) the bytes
over the link's bandwidth plus its round trip (``Link``, learnt from the scheduler's own
cross-host transfers). A worker that would stay but has no room is waited for.

Along a chain the rule is applied a step early, when a step is sent: if its successor is
predicted to stay, the worker keeps what the step makes and the successor is pinned to it, as
under ``affinity`` (the object never goes back to the scheduler, nor across the link and
back); otherwise the worker hands it straight to the worker ``choose`` picks for the
successor now (``hands_on``: one ownership transfer, crossing to another host at most once),
where the successor is then pinned. The prediction uses the loads as this choice saw them:
the rule ``choose`` applies when the next step is ready, applied now, so neither a stay nor a
move goes through the scheduler. Beyond a chain a step whose outputs one step alone reads (a
join's input) hands them to that step's worker, chosen by ``choose`` when the first of the
join's inputs is sent (``join_binding``); the others come back and their readers are placed
when ready.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from orchestrator.scheduler.placement import Route, WorkerLoad, move_cost_s
from orchestrator.scheduler.policies.base import Ahead, Choice, PlacementPolicy

__all__ = ["Auto", "stays"]


class Auto(PlacementPolicy):
    """Stay where the data is unless moving beats waiting."""

    direct: ClassVar[bool] = True

    def choose(self, choice: Choice) -> str | None:
        best = choice.best()
        current = choice.live(choice.near)
        if current is None:
            return best.worker_id if best is not None else None
        stay = current.worker_id if current.has_room(choice.task_s) else None  # None: wait
        if best is None or best is current:
            return stay
        if stays(current, [best], task_s=choice.task_s, nbytes=choice.nbytes, route=choice.route):
            return stay
        return best.worker_id

    def keeps(self, ahead: Ahead) -> bool:
        if not ahead.may_keep():
            return False
        step = ahead.next_step()
        return step is not None and stays(
            step.here, step.others, task_s=step.task_s, nbytes=step.nbytes, route=step.route
        )


def stays(
    current: WorkerLoad,
    others: Sequence[WorkerLoad],
    *,
    task_s: float,
    nbytes: int,
    route: Route | None = None,
) -> bool:
    """Whether the next task (expected to take ``task_s``) should run where the object is, on
    ``current``: waiting there costs no more than waiting at any of ``others`` plus moving the
    object of ``nbytes`` to it (from ``current``'s host, through ``route.hub``'s, to the
    other's: along a chain the hub is ``current``'s own host, the object handed on straight)."""
    route = route or Route()
    wait_here = current.backlog * task_s
    way = Route(current.host, route.hub, route.link)
    return all(
        wait_here <= w.backlog * task_s + move_cost_s(nbytes, way.crossings(w.host), route.link)
        for w in others
    )
