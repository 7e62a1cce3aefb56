"""Driving a run again from its last durable point, the input in S3, when the scheduler can no
longer trust its state: whatever it had out (an instruction, an object in a worker or in the
minion) is withdrawn or released, and the same workflow starts over at its first step, each
step's attempts going on from the last one placed (``RunState.again``), with fresh object keys.

That one mechanism serves every failure the scheduler cannot repair in place:

* a step that raised while being placed, dispatched or finished (``sweep`` finds a run with
  nothing under way and places its ready steps again), or an instruction Redis did not take
  after objects had gone to its worker (``Dispatcher.take_unsent``);
* the CDI minion restarted, so every object is gone (``minion_restarted``);
* Postgres failed a statement, so what it holds may differ from memory (``resync``: drop every
  run and resume our RUNNING workflows from what Postgres has, ``Claims.resume``).

A run driven ``MAX_DRIVES`` times fails with the reason, so a fault that never clears ends in
a FAILED workflow that says why, not in a loop.
"""

from __future__ import annotations

import logging
from typing import Final

import redis

import cdi
from orchestrator.contract import keys
from orchestrator.scheduler.claims import Claims
from orchestrator.scheduler.context import SchedulerContext
from orchestrator.scheduler.dispatch import Dispatcher
from orchestrator.scheduler.endings import Endings
from orchestrator.scheduler.guarded import guarded
from orchestrator.scheduler.planes import uses_objects
from orchestrator.scheduler.runs import Phase, RunState

__all__ = ["MAX_DRIVES", "Redrive"]

log = logging.getLogger(__name__)

MAX_DRIVES: Final = 8  # a run driven this often (resumes included) fails with the reason
_BACKOFF_S: Final = (0.2, 0.5, 1.0, 2.0, 4.0)  # before drive 2, 3, ... (then the last)


class Redrive:
    """Drives runs again, starting them over through ``claims``."""

    def __init__(
        self, ctx: SchedulerContext, dispatch: Dispatcher, endings: Endings, claims: Claims
    ) -> None:
        self.ctx = ctx
        self.dispatch = dispatch
        self.endings = endings
        self.claims = claims

    def run(self, run: RunState, reason: str, *, objects_gone: bool = False) -> None:
        """Withdraw what ``run`` has out, release its objects, and drive it again from its
        input (or fail it, once it was driven ``MAX_DRIVES`` times)."""
        ctx = self.ctx
        self._withdraw(run)
        for step in run.steps.values():
            self.dispatch.waiting.pop((run.workflow_id, step.id), None)
        if objects_gone:
            run.objects = {}
        if run.cancelled:
            guarded(lambda: self.endings.quiet(run), ctx.faults)
            ctx.runs.pop(run.workflow_id, None)
            return
        self._release(run)
        if run.drives >= MAX_DRIVES:
            self.endings.fail(run, f"driven {run.drives} times without finishing; last: {reason}")
            return
        again = run.again()
        delay = _BACKOFF_S[min(run.drives, len(_BACKOFF_S)) - 1]
        ctx.runs[run.workflow_id] = again
        log.warning("workflow %s: %s; driving it again from its input (drive %d)",
                    run.workflow_id, reason, again.drives)  # fmt: skip
        guarded(lambda: ctx.db.redriven(run.workflow_id, reason), ctx.faults)
        guarded(lambda: self.claims.start(again, delay), ctx.faults)

    def minion_restarted(self) -> None:
        """Every object is gone: drive again each run that had one (or was making one)."""
        for run in list(self.ctx.runs.values()):
            if uses_objects(run):
                self.run(
                    run, "the CDI minion restarted and its objects are gone", objects_gone=True
                )

    def sweep(self) -> None:
        """Place again every run with nothing under way: no instruction out, no retry due, not
        waiting for room, yet steps ready (a step that raised midway leaves a run so)."""
        ctx = self.ctx
        for run in list(ctx.runs.values()):
            if any(True for _ in run.out()):
                continue
            if run.cancelled:
                guarded(lambda run=run: self.endings.quiet(run), ctx.faults)  # type: ignore[misc]
                continue
            if run.paused:
                continue  # its steps wait on purpose
            ready = [s for s in run.steps.values() if s.phase is Phase.READY]
            if not ready or any(s.retry_at for s in ready):
                continue
            if any((run.workflow_id, s.id) in self.dispatch.waiting for s in ready):
                continue
            log.warning("workflow %s had nothing under way; placing %s again",
                        run.workflow_id, ", ".join(s.id for s in ready))  # fmt: skip
            guarded(lambda run=run: self._place_again(run), ctx.faults)  # type: ignore[misc]

    def _place_again(self, run: RunState) -> None:
        """Place ``run``'s ready steps; an object not where the run had it (not ours, or gone)
        cannot be fixed by trying again: the run is driven again from its input (or fails)."""
        try:
            self.dispatch.dispatch(run)
        except (cdi.NotOwner, cdi.ObjectNotFound) as exc:
            self.run(run, f"an object of the run is not where the scheduler had it ({exc})")

    def resync(self) -> None:
        """Postgres failed a statement: forget every run and resume our RUNNING workflows from
        what Postgres has. Raises while Postgres is still away (tried again next tick)."""
        ctx = self.ctx
        for run in list(ctx.runs.values()):
            self._withdraw(run)
            self._release(run)
        ctx.runs.clear()
        self.dispatch.waiting.clear()
        self.claims.resume("Postgres failed a statement of its scheduler")
        ctx.faults.postgres = False

    # ------------------------------------------------------------------ helpers
    def _withdraw(self, run: RunState) -> None:
        """Take ``run``'s instructions back from their workers' lists (best effort: a worker
        that already runs one reports to nobody who waits, and that report is dropped as
        stale)."""
        for step in list(run.out()):
            flight = step.in_flight
            assert flight is not None
            if self.endings.withdraw(run, step):
                continue  # never started: what it was given is taken back
            self.dispatch.returned(flight)
            step.in_flight = None
            try:
                # A restarted worker of the same id must not run it from its in-flight list.
                text = flight.instruction.dumps()
                self.ctx.redis.lrem(keys.worker_inflight_key(flight.worker), 0, text)  # type: ignore[arg-type]
            except redis.RedisError as exc:
                log.warning("could not withdraw task run %s from %s: %s",
                            flight.task_run_id, flight.worker, exc)  # fmt: skip

    def _release(self, run: RunState) -> None:
        try:
            self.endings.release_objects(run)
        except Exception as exc:  # the minion is away: the objects are lost anyway
            log.warning("could not release the objects of workflow %s: %s", run.workflow_id, exc)
