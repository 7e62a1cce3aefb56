"""Driving a run again from its last durable point, the input in S3, when the scheduler can no
longer trust its state: whatever it had out (an instruction, an object in a worker or in the
minion) is withdrawn or released, and the same workflow starts over at its first step, each
step's attempts going on from the last one placed (``RunState.again``), with fresh object keys.

That one mechanism serves every failure the scheduler cannot repair in place:

* a step that raised while being placed, dispatched or finished (``sweep`` finds a run with
  nothing under way and places it again; ``unsent`` handles an instruction Redis did not take);
* the CDI minion restarted, so every object is gone (``minion_restarted``);
* Postgres failed a statement, so what it holds may differ from memory (``resync``: drop every
  run and resume our RUNNING workflows from what Postgres has, ``Claims.resume``).

A run driven ``MAX_DRIVES`` times fails with the reason, so a fault that never clears ends in
a FAILED workflow that says why, not in a loop.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Final

import redis

from orchestrator.contract import keys
from orchestrator.contract.vocabulary import DataPlane
from orchestrator.scheduler.context import SchedulerContext
from orchestrator.scheduler.dispatch import Dispatcher
from orchestrator.scheduler.endings import Endings
from orchestrator.scheduler.guarded import guarded
from orchestrator.scheduler.runs import RunState

if TYPE_CHECKING:
    from orchestrator.scheduler.claims import Claims

__all__ = ["MAX_DRIVES", "Redrive"]

log = logging.getLogger(__name__)

MAX_DRIVES: Final = 8  # a run driven this often (resumes included) fails with the reason
_BACKOFF_S: Final = (0.2, 0.5, 1.0, 2.0, 4.0)  # before drive 2, 3, ... (then the last)


class Redrive:
    """Drives runs again; the claims it resumes through are set once the loop has them."""

    def __init__(self, ctx: SchedulerContext, dispatch: Dispatcher, endings: Endings) -> None:
        self.ctx = ctx
        self.dispatch = dispatch
        self.endings = endings
        self.claims: Claims | None = None

    def run(self, run: RunState, reason: str, *, objects_gone: bool = False) -> None:
        """Withdraw what ``run`` has out, release its object, and drive it again from its
        input (or fail it, once it was driven ``MAX_DRIVES`` times)."""
        ctx = self.ctx
        self._withdraw(run)
        self.dispatch.waiting.pop(run.workflow_id, None)
        if run.cancelled:
            if objects_gone:
                run.key = ""
            guarded(lambda: self.endings.cleanup_cancelled(run), ctx.faults)
            ctx.runs.pop(run.workflow_id, None)
            return
        if not objects_gone:
            self._release(run)
        run.key = ""  # released (or gone): no ending frees it again
        if run.drives >= MAX_DRIVES:
            self.endings.fail(run, f"driven {run.drives} times without finishing; last: {reason}")
            return
        again = run.again()
        again.retry_at = time.monotonic() + _BACKOFF_S[min(run.drives, len(_BACKOFF_S)) - 1]
        ctx.runs[run.workflow_id] = again
        log.warning("workflow %s: %s; driving it again from its input (drive %d)",
                    run.workflow_id, reason, again.drives)  # fmt: skip
        guarded(lambda: ctx.db.redriven(run.workflow_id, reason), ctx.faults)

    def minion_restarted(self) -> None:
        """Every object is gone: drive again each CDI run that had one (or was making one)."""
        for run in list(self.ctx.runs.values()):
            if run.data_plane == DataPlane.CDI and (run.key or run.in_flight is not None):
                self.run(
                    run, "the CDI minion restarted and its objects are gone", objects_gone=True
                )

    def unsent(self, run: RunState, worker: str, moved: bool, exc: Exception) -> None:
        """Redis did not take ``run``'s instruction for ``worker``. Nothing is out: place it
        again soon; if its object was already moved to that worker, drive the run again (the
        worker is asked to give the object back)."""
        flight = run.in_flight
        if flight is not None:
            self.dispatch.returned(flight)
            run.in_flight = None
        if moved:
            self.run(run, f"Redis failed the instruction for {worker} ({exc})")
            return
        run.retry_at = time.monotonic() + _BACKOFF_S[1]
        log.warning("workflow %s: Redis failed the instruction for %s (%s); placing it again",
                    run.workflow_id, worker, exc)  # fmt: skip

    def sweep(self) -> None:
        """Place again every run with nothing under way: no instruction out, no retry due, not
        waiting for room (a step that raised midway leaves a run so)."""
        ctx = self.ctx
        for run in list(ctx.runs.values()):
            if (
                run.in_flight is not None
                or run.retry_at
                or run.workflow_id in self.dispatch.waiting
            ):
                continue
            if run.cancelled:
                guarded(lambda run=run: self.endings.cleanup_cancelled(run), ctx.faults)  # type: ignore[misc]
                continue
            log.warning("workflow %s had nothing under way; placing step %r again",
                        run.workflow_id, run.current.ref)  # fmt: skip
            guarded(lambda run=run: self.dispatch.dispatch(run), ctx.faults)  # type: ignore[misc]

    def resync(self) -> None:
        """Postgres failed a statement: forget every run and resume our RUNNING workflows from
        what Postgres has. Raises while Postgres is still away (tried again next tick)."""
        ctx = self.ctx
        for run in list(ctx.runs.values()):
            self._withdraw(run)
            self._release(run)
        ctx.runs.clear()
        self.dispatch.waiting.clear()
        assert self.claims is not None
        self.claims.resume("Postgres failed a statement of its scheduler")
        ctx.faults.postgres = False

    # ------------------------------------------------------------------ helpers
    def _withdraw(self, run: RunState) -> None:
        """Take ``run``'s instruction back from its worker's lists (best effort: a worker that
        already runs it reports to nobody who waits, and that report is dropped as stale)."""
        flight = run.in_flight
        if flight is None:
            return
        self.dispatch.returned(flight)
        run.in_flight = None
        text = flight.instruction.dumps()
        try:
            pipe = self.ctx.redis.pipeline(transaction=False)
            pipe.lrem(keys.worker_queue_key(flight.worker), 0, text)
            pipe.lrem(keys.worker_inflight_key(flight.worker), 0, text)
            pipe.execute()
        except redis.RedisError as exc:
            log.warning("could not withdraw task run %s from %s: %s",
                        flight.task_run_id, flight.worker, exc)  # fmt: skip

    def _release(self, run: RunState) -> None:
        try:
            self.endings.release_object(run)
        except Exception as exc:  # the minion is away: the object is lost anyway
            log.warning("could not release the object of workflow %s: %s", run.workflow_id, exc)
