"""How a case's workflows ended, every one of them: waited for, read and judged.

    tally = judge(load, runs, target, since=began, deadline_s=180)
    tally.stuck, tally.lost, tally.wrong, tally.leaked_objects   # the goal: all 0

Every case ends with this: it waits (at most ``deadline_s``) until the API counts as many
finished runs since the case began as it started, reads each run's last word, judges each
(``Workload.verdict``: completed with the right pixels and label, or failed saying why) and
waits for every minion to hold no object (``CaseTarget.objects_held``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from loadtest.chaos.workload import FINISHED, Started, Workload

if TYPE_CHECKING:
    from loadtest.chaos.faults import CaseTarget

__all__ = ["Tally", "judge", "until"]


@dataclass
class Tally:
    completed: int = 0  # completed with the right result
    failed: int = 0  # failed with a reason
    stuck: int = 0
    lost: int = 0
    wrong: int = 0
    leaked_objects: int = 0
    # Workflows that ran again from their input (``Workload.reruns_from_input``); None: unknown.
    rerun_from_input: int | None = None
    rerun_reasons: list[str] = field(default_factory=list)  # failed task runs' errors in those
    failures: list[str] = field(default_factory=list)  # the distinct reasons of FAILED runs
    stuck_runs: list[dict[str, Any]] = field(default_factory=list)  # where each stuck run was

    @property
    def ended_right(self) -> bool:
        return (self.stuck, self.lost, self.wrong, self.leaked_objects) == (0, 0, 0, 0)


def judge(
    load: Workload,
    runs: dict[str, Started],
    target: CaseTarget,
    *,
    since: float,
    deadline_s: float,
) -> Tally:
    until(lambda: finished(load, since) >= len(runs), deadline_s)
    read_all(load, runs)
    verdicts = {run.id: load.verdict(run) for run in runs.values()}
    values = list(verdicts.values())
    ok = [r for r in runs.values() if verdicts[r.id] == "ok"]
    reruns = load.reruns_from_input(runs)
    return Tally(
        completed=sum(r.status == "COMPLETED" for r in ok),
        failed=sum(r.status == "FAILED" for r in ok),
        stuck=values.count("stuck"),
        lost=values.count("lost"),
        wrong=values.count("wrong"),
        leaked_objects=leaked_objects(target),
        rerun_from_input=None if reruns is None else reruns[0],
        rerun_reasons=[] if reruns is None else reruns[1],
        failures=sorted(
            {str(r.detail.get("error")) for r in runs.values() if r.status == "FAILED"}
        ),
        stuck_runs=[load.where_stuck(r) for r in runs.values() if verdicts[r.id] == "stuck"],
    )


def finished(load: Workload, since: float) -> int:
    """Runs of the case's pipeline created since ``since`` that have finished (0 while the
    API does not answer)."""
    return load.finished_since(since) or 0


def read_all(load: Workload, runs: dict[str, Started]) -> None:
    """Every run's last word, however many (the list's pages; the ones it does not show one
    by one until each is found or known LOST)."""
    for _ in range(1 + len(runs) // 50):
        load.refresh(runs)
        if all(r.status in FINISHED or r.status == "LOST" for r in runs.values()):
            return


def until(check: Callable[[], bool], deadline_s: float, every_s: float = 0.25) -> bool:
    """Whether ``check`` came true before ``deadline_s`` passed."""
    deadline = time.monotonic() + deadline_s
    while not check():
        if time.monotonic() >= deadline:
            return False
        time.sleep(every_s)
    return True


def leaked_objects(target: CaseTarget, wait_s: float = 30.0) -> int:
    """Objects the minions still hold once every workflow has ended (after a grace: the last
    ones are handed back and destroyed just after their workflow ends); 1 if a minion never
    answered."""
    deadline = time.monotonic() + wait_s
    count: int | None = None
    while time.monotonic() < deadline:
        count = target.objects_held()
        if count == 0:
            return 0
        time.sleep(0.5)
    return 1 if count is None else count
