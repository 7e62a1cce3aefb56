"""How the scheduler keeps every workflow moving when one of its parts fails.

A run whose state the scheduler can no longer trust is **driven again** from its last durable
point, the input in S3: whatever it had out (an instruction, an object in a worker or in the
minion) is withdrawn or released, and the same workflow starts over at its first step, each
step's attempts going on from the last one placed (``RunState.again``), with fresh object keys.
That one mechanism serves every failure the scheduler cannot repair in place:

* a step that raised while being placed, dispatched or finished (``sweep`` finds a run with
  nothing under way and places it again; ``unsent`` handles an instruction Redis did not take);
* the CDI minion restarted, so every object is gone (``minion_restarted``);
* Postgres failed a write, so what it holds may differ from memory (``resync``: drop every run
  and drive our RUNNING workflows again from what Postgres has);
* the scheduler itself restarted, or a write of its was lost (``resume_own``: our RUNNING
  workflows that no run in memory stands for).

A run driven ``MAX_DRIVES`` times fails with the reason, so a fault that never clears ends in
a FAILED workflow that says why, not in a loop. Messages that could not be sent (a release of
an object a worker holds, while Redis is away) wait in ``outbox`` and go at the next tick.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable
from typing import TYPE_CHECKING, Final

import redis
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from orchestrator import keys
from orchestrator.db.models import TaskRun, TaskRunStatus, Workflow, WorkflowStatus
from orchestrator.db.repository import workflows as repo
from orchestrator.errors import OrchestratorError
from orchestrator.scheduler.runs import RunState

if TYPE_CHECKING:
    from orchestrator.scheduler.scheduler import Scheduler

__all__ = ["MAX_DRIVES", "Recovery"]

log = logging.getLogger(__name__)

MAX_DRIVES: Final = 8  # a run driven this often (resumes included) fails with the reason
_BACKOFF_S: Final = (0.2, 0.5, 1.0, 2.0, 4.0)  # before drive 2, 3, ... (then the last)


class Recovery:
    """The scheduler's recovery paths; state lives in the scheduler (its runs, counts)."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.s = scheduler
        self.outbox: list[tuple[str, str]] = []  # (worker queue key, message) not yet sent
        self.resync_needed = False

    # ------------------------------------------------------------------ driving again
    def redrive(self, run: RunState, reason: str, *, objects_gone: bool = False) -> None:
        """Withdraw what ``run`` has out, release its object, and drive it again from its
        input (or fail it, once it was driven ``MAX_DRIVES`` times)."""
        s = self.s
        self._withdraw(run)
        s._waiting.pop(run.workflow_id, None)
        if run.cancelled:
            if not objects_gone:
                s._cleanup_cancelled(run)
            s.runs.pop(run.workflow_id, None)
            return
        if not objects_gone:
            self._release(run)
        if run.drives >= MAX_DRIVES:
            run.key = ""  # released above
            s._fail(run, f"driven {run.drives} times without finishing; last: {reason}")
            return
        again = run.again()
        again.retry_at = time.monotonic() + _BACKOFF_S[min(run.drives, len(_BACKOFF_S)) - 1]
        s.runs[run.workflow_id] = again
        s._next_tick = min(s._next_tick, again.retry_at)
        log.warning("workflow %s: %s; driving it again from its input (drive %d)",
                    run.workflow_id, reason, again.drives)  # fmt: skip
        self._record([run.workflow_id], "workflow.redriven", reason)

    def minion_restarted(self) -> None:
        """Every object is gone: drive again each CDI run that had one (or was making one)."""
        for run in list(self.s.runs.values()):
            if run.data_plane == "cdi" and (run.key or run.in_flight is not None):
                self.redrive(
                    run, "the CDI minion restarted and its objects are gone", objects_gone=True
                )

    def unsent(self, run: RunState, worker: str, moved: bool, exc: Exception) -> None:
        """Redis did not take ``run``'s instruction for ``worker``. Nothing is out: place it
        again soon; if its object was already moved to that worker, drive the run again (the
        worker is asked to give the object back)."""
        s = self.s
        s._in_flight[worker] -= 1
        run.in_flight = None
        if moved:
            self.redrive(run, f"Redis failed the instruction for {worker} ({exc})")
            return
        run.retry_at = time.monotonic() + _BACKOFF_S[1]
        s._next_tick = min(s._next_tick, run.retry_at)
        log.warning("workflow %s: Redis failed the instruction for %s (%s); placing it again",
                    run.workflow_id, worker, exc)  # fmt: skip

    def sweep(self) -> None:
        """Place again every run with nothing under way: no instruction out, no retry due, not
        waiting for room (a step that raised midway leaves a run so)."""
        s = self.s
        for run in list(s.runs.values()):
            if run.in_flight is not None or run.retry_at or run.workflow_id in s._waiting:
                continue
            if run.cancelled:
                s._guarded(lambda run=run: s._cleanup_cancelled(run))  # type: ignore[misc]
                continue
            log.warning("workflow %s had nothing under way; placing step %r again",
                        run.workflow_id, run.current.ref)  # fmt: skip
            s._guarded(lambda run=run: s._dispatch(run))  # type: ignore[misc]

    # ------------------------------------------------------------------ from Postgres
    def resync(self) -> None:
        """Postgres failed a write: forget every run and drive our RUNNING workflows again from
        what Postgres has. Raises while Postgres is still away (tried again next tick)."""
        s = self.s
        for run in list(s.runs.values()):
            self._withdraw(run)
            self._release(run)
        s.runs.clear()
        s._waiting.clear()
        s._in_flight.clear()
        self.resync_needed = False
        try:
            self.resume_own("Postgres failed a write")
        except Exception:
            self.resync_needed = True
            raise

    def resume_own(self, reason: str) -> None:
        """Drive again our RUNNING workflows that no run in memory stands for, each step's
        attempts going on from the last one Postgres has."""
        s = self.s
        with s.sessions() as session, session.begin():
            query = select(Workflow).where(
                Workflow.status == WorkflowStatus.RUNNING, Workflow.claimed_by == s.id
            )
            if s.runs:
                query = query.where(Workflow.id.not_in(list(s.runs)))
            mine = session.scalars(query).all()
            if not mine:
                return
            ids = [w.id for w in mine]
            attempts = _attempts(session, ids)
            _close_open_task_runs(session, ids, f"{reason}; the workflow goes on from its input")
            failed: list[tuple[uuid.UUID, str]] = []
            for workflow in mine:
                try:
                    plan = s._plan_orm(session, workflow)
                except OrchestratorError as exc:
                    failed.append((workflow.id, str(exc)))
                    continue
                run = plan.again(attempts.get(workflow.id, {}))
                s.runs[run.workflow_id] = run
                repo.record_event(
                    session, "workflow.resumed", {"scheduler": s.id, "reason": reason},
                    workflow_id=workflow.id,
                )  # fmt: skip
        log.warning("resuming %d workflow(s) from their input: %s", len(mine) - len(failed), reason)
        for workflow_id, why in failed:
            s._fail_id(workflow_id, why)
        for run in [s.runs[w.id] for w in mine if w.id in s.runs]:
            s._guarded(lambda run=run: s._dispatch(run))  # type: ignore[misc]

    # ------------------------------------------------------------------ sending later
    def send_later(self, queue: str, message: str) -> None:
        self.outbox.append((queue, message))

    def flush_outbox(self) -> None:
        while self.outbox:
            queue, message = self.outbox[0]
            self.s.redis.lpush(queue, message)  # a Redis error leaves it for the next tick
            self.outbox.pop(0)

    # ------------------------------------------------------------------ helpers
    def _withdraw(self, run: RunState) -> None:
        """Take ``run``'s instruction back from its worker's lists (best effort: a worker that
        already runs it reports to nobody who waits, and that report is dropped as stale)."""
        lost = run.in_flight
        if lost is None:
            return
        s = self.s
        s._in_flight[run.in_flight_worker] -= 1
        run.in_flight = None
        text = lost.dumps()
        try:
            pipe = s.redis.pipeline(transaction=False)
            pipe.lrem(keys.worker_queue_key(run.in_flight_worker), 0, text)
            pipe.lrem(keys.worker_inflight_key(run.in_flight_worker), 0, text)
            pipe.execute()
        except redis.RedisError as exc:
            log.warning("could not withdraw task run %s from %s: %s",
                        lost.task_run_id, run.in_flight_worker, exc)  # fmt: skip

    def _release(self, run: RunState) -> None:
        try:
            self.s._release_object(run)
        except Exception as exc:  # the minion or Redis is away: the object is lost anyway
            log.warning("could not release the object of workflow %s: %s", run.workflow_id, exc)

    def _record(self, ids: Iterable[uuid.UUID], kind: str, reason: str) -> None:
        """Best effort: the open task runs of ``ids`` FAILED with ``reason``, and an event."""
        try:
            with self.s.sessions() as session, session.begin():
                _close_open_task_runs(session, list(ids), reason)
                for workflow_id in ids:
                    repo.record_event(session, kind, {"reason": reason}, workflow_id=workflow_id)
        except Exception as exc:
            log.warning("could not record %s: %s", kind, exc)
            self.resync_needed = True


def _attempts(session: Session, ids: list[uuid.UUID]) -> dict[uuid.UUID, dict[str, int]]:
    """Per workflow, the last attempt Postgres has of each step."""
    rows = session.execute(
        select(TaskRun.workflow_id, TaskRun.ref, func.max(TaskRun.attempt))
        .where(TaskRun.workflow_id.in_(ids))
        .group_by(TaskRun.workflow_id, TaskRun.ref)
    ).all()
    found: dict[uuid.UUID, dict[str, int]] = {}
    for workflow_id, ref, attempt in rows:
        found.setdefault(workflow_id, {})[ref] = int(attempt)
    return found


def _close_open_task_runs(session: Session, ids: list[uuid.UUID], reason: str) -> None:
    session.execute(
        update(TaskRun)
        .where(
            TaskRun.workflow_id.in_(ids),
            TaskRun.status.in_([TaskRunStatus.QUEUED, TaskRunStatus.RUNNING]),
        )
        .values(status=TaskRunStatus.FAILED, error=reason)
    )
