"""Faults struck while a worker holds a join's input ahead of the join: in the chaos graph
(``workload.GRAPH``) ``smooth`` ends at once and its image goes to the join's worker (or
stays on its own, being that worker) while ``nap`` and ``sharpen`` still run; no task of that
worker reads it yet, so only the scheduler's look at what workers hold ahead
(``orchestrator/scheduler/ahead.py``) gets it back when that worker dies.

Each fault waits, on the case's workload, until the API shows such a run, then strikes:
the holder killed (its id comes back with a new process), or the scheduler killed (the new
one must find where each held input is). A case whose workload runs no graph fails saying so.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Final

import httpx

from loadtest.chaos.workload import GRAPH

if TYPE_CHECKING:
    from loadtest.chaos.faults import Target

__all__ = ["HELD_WAIT_S", "held_join_input", "kill_holder", "kill_scheduler_while_held"]

HELD_WAIT_S: Final = 60.0  # a graph case has several in flight: one holds soon
RECENT: Final = 50  # the newest graph runs looked at: those of the case in flight among them
MAX_FED: Final = 20  # graphs a fault may start to find a held input
HELD: Final = "smooth"  # the branch whose image waits for the join
JOIN: Final = "blend"


def held_join_input(api: httpx.Client) -> tuple[str, str] | bool | None:
    """A graph run in flight whose ``smooth`` image a worker holds for a join not yet placed:
    (the run's id, that worker); ``True`` while graphs are in flight but none holds one,
    ``False`` when none is, None when the API does not answer."""
    try:
        reply = api.get("/api/workflows", params={"workflow": GRAPH, "limit": RECENT})
        if reply.status_code != 200:
            return None
        flying = [i for i in reply.json()["items"] if i["status"] in ("PENDING", "RUNNING")]
        for item in flying:
            detail = api.get(f"/api/workflows/{item['id']}")
            if detail.status_code == 200 and (holder := _holder(detail.json())) is not None:
                return str(item["id"]), holder
    except httpx.HTTPError:
        return None
    return bool(flying)


def _holder(run: dict[str, Any]) -> str | None:
    """The worker holding ``run``'s ``smooth`` image for its join: where it was handed, or
    where it was made (kept); None unless it is made and the join not yet placed."""
    task_runs = run.get("task_runs") or ()
    made = [t for t in task_runs if t["ref"] == HELD and t["status"] == "COMPLETED"]
    if not made or any(t["ref"] == JOIN for t in task_runs):
        return None
    handed = [h["to_container"] for h in run.get("handoffs") or () if h["datum"] == f"{HELD}.image"]
    holder = handed[-1] if handed else made[-1]["worker_id"]
    return str(holder) if holder else None


def _wait_for_held(target: Target) -> tuple[str, str]:
    """The first held input seen; while no graph is in flight (the case's may all have ended
    between two looks), one more is started (judged with the case's, ``Workload.feed``)."""
    load = target.load
    assert load is not None, "a join fault strikes within a case (its workload)"
    deadline = time.monotonic() + HELD_WAIT_S
    while time.monotonic() < deadline:
        found = held_join_input(load.api)
        if isinstance(found, tuple):
            return found
        if found is False and len(load.fed) < MAX_FED:
            load.feed()
        time.sleep(0.02)
    raise RuntimeError(
        f"no worker held a join's input for {HELD_WAIT_S:g} s ({len(load.fed)} graphs started "
        "to find one): does the workload run graphs?"
    )


def kill_holder(target: Target) -> None:
    """SIGKILL of the worker holding a join's input ahead of the join."""
    _, worker = _wait_for_held(target)
    target.kill(worker)


def kill_scheduler_while_held(target: Target) -> None:
    """SIGKILL of the scheduler while a worker holds a join's input ahead of the join."""
    _wait_for_held(target)
    target.kill("scheduler-1")
