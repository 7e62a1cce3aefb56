"""What the scheduler does with a worker's report: follow the object, place the next step or
end the run, or retry a failed attempt.

A report and what follows from it are written in one statement (``SchedulerStore.report``):
the task run's outcome, the hand-back of its object, and the next step's task run or the
run's end. The next step's instruction goes out before that statement (*send, then record*,
``dispatch``).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable

import redis

import cdi
from orchestrator.contract.messages import Report
from orchestrator.contract.vocabulary import DataPlane, TaskRunStatus
from orchestrator.db.run_statements import Finish, Handoff, Placement
from orchestrator.logs import log_context
from orchestrator.scheduler.context import SchedulerContext
from orchestrator.scheduler.dispatch import Dispatcher
from orchestrator.scheduler.endings import Endings, completion
from orchestrator.scheduler.guarded import guarded
from orchestrator.scheduler.instructions import result_uri, work_uri
from orchestrator.scheduler.runs import RunState

__all__ = ["Reports"]

log = logging.getLogger(__name__)


class Reports:
    """Turns reports into the runs' next moves."""

    def __init__(
        self,
        ctx: SchedulerContext,
        dispatch: Dispatcher,
        endings: Endings,
        *,
        wake_at: Callable[[float], None],
    ) -> None:
        self.ctx = ctx
        self.dispatch = dispatch
        self.endings = endings
        self._wake_at = wake_at  # the loop's tick comes no later than this (monotonic)

    def read(self, text: str) -> None:
        """Handle one report as it came off the list; an unreadable one is dropped."""
        try:
            report = Report.loads(text)
        except (ValueError, TypeError):
            log.warning("dropping an unreadable report: %.200s", text)
            return
        with log_context(workflow_id=report.workflow_id, task_run_id=report.task_run_id):
            guarded(lambda: self.handle(report), self.ctx.faults)

    def handle(self, report: Report) -> None:
        run = self.ctx.runs.get(uuid.UUID(report.workflow_id))
        flight = run.flight(report.task_run_id) if run is not None else None
        if run is None or flight is None:
            log.info("stale report for task run %s", report.task_run_id)
            if report.key and (run is None or report.key != run.key):
                # Its run is over, or was driven again: the object is nobody's any more.
                self.endings.drop_stale(report)
            return
        self.dispatch.returned(flight)
        run.in_flight = None
        completed = report.status == TaskRunStatus.COMPLETED
        if run.data_plane == DataPlane.CDI:
            self._follow_object(run, report, completed)
        step = run.current
        all_done = completed and run.last_step
        if completed:
            self.dispatch.ran(step.task, max(0.0, report.finished_at - report.started_at))
            run.outputs[step.ref] = report.output
            if run.data_plane == DataPlane.CDI:
                # What the next hand-off moves: the new image, or the input a reader passes on.
                run.nbytes = report.bytes_out or report.bytes_in or run.nbytes
            if run.data_plane == DataPlane.OBJECT_STORE:
                run.current_uri = work_uri(self.ctx.objects, run, step)
        back = None
        if report.kept is False and run.data_plane == DataPlane.CDI and report.key:
            back = Handoff(
                report.worker_id,
                self.ctx.id,
                report.bytes_out or run.nbytes,
                report.return_us,
                self.dispatch.host_of(report.worker_id),
                self.ctx.cdi.host,
            )
        placement: Placement | None = None
        finish: Finish | None = None
        if completed and not run.cancelled and not all_done:
            run.advance()
            try:
                placement = self.dispatch.choose(run)
            except (redis.RedisError, cdi.CDIError) as exc:  # the tick's sweep places it later
                log.warning("workflow %s: could not place step %r now: %s",
                            run.workflow_id, run.current.ref, exc)  # fmt: skip
                self.ctx.faults.minion |= isinstance(exc, cdi.MinionUnavailable)
        elif all_done and not run.cancelled and (run.data_plane != DataPlane.CDI or report.stored):
            # Nothing left to store (dataless, or the last task stored the result itself).
            dataless = run.data_plane == DataPlane.NONE
            finish = completion(run, None if dataless else result_uri(self.ctx.objects, run))
        if placement is not None and not self.dispatch.send(run, placement):
            placement = None  # Redis did not take it: the run goes on from ``unsent``
        # One statement records the report and the next step's placement, or ends the workflow.
        ended = self.ctx.db.report(report, back, placement, finish)
        if not completed:
            self.after_failure(run, report.error or report.status, report.retryable)
        elif run.cancelled:
            self.endings.cleanup_cancelled(run)
        elif finish is not None:
            self.endings.completed(run, ended)
        elif all_done:
            # A worker that kept the last image to itself: it predates storing results.
            self.endings.fail(
                run,
                f"worker {report.worker_id} completed the last task without storing the "
                "result; run workers of the scheduler's version (they are upgraded together)",
            )

    def after_failure(self, run: RunState, reason: str, retryable: bool) -> None:
        """A failed attempt of the current step: retry it after its backoff, or fail the run."""
        step = run.current
        if run.cancelled:
            self.endings.cleanup_cancelled(run)
        elif retryable and run.attempt <= step.retries:
            run.retry_at = time.monotonic() + step.retry_backoff_s * 2 ** (run.attempt - 1)
            run.attempt += 1
            self._wake_at(run.retry_at)  # the tick dispatches it
        else:
            self.endings.fail(
                run, f"task {step.ref!r} failed after {run.attempt} attempt(s): {reason}"
            )

    def _follow_object(self, run: RunState, report: Report, completed: bool) -> None:
        """Where the run's CDI object is now, and whether the image a worker held survived."""
        run.key = "" if report.stored else report.key or run.key
        run.owner = report.worker_id if report.kept else self.ctx.id
        held = completed and report.held
        if run.follow_held(report.task_run_id, held=held, lost=report.held_lost):
            log.warning(
                "workflow %s: worker %s lost the image it held from step %r on; running "
                "the workflow on from that step again, from %r",
                run.workflow_id,
                report.worker_id,
                run.current.ref,  # the step it rewound to
                run.key,
            )
