"""How a run leaves the scheduler: completed, failed, or cancelled by a user, and what it held
(a CDI object) is freed.

An ending is written with one statement (``SchedulerStore.finish``, or with the last report),
which changes nothing if the run has ended already: a user who cancelled meanwhile keeps their
word. Once written, requests waiting on the run are told (``contract.announce_finished``).

An object a worker keeps is asked back with a no-op instruction; one Redis does not take now
waits in ``outbox`` and goes at the next tick, so no object is left behind by a Redis outage.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

import redis

import cdi
from orchestrator.contract import announce_finished, keys
from orchestrator.contract.messages import Report
from orchestrator.contract.vocabulary import DataPlane, WorkflowStatus
from orchestrator.db.run_statements import Finish
from orchestrator.scheduler.context import SchedulerContext
from orchestrator.scheduler.instructions import release_instruction
from orchestrator.scheduler.runs import RunState

__all__ = ["Endings", "completion"]

log = logging.getLogger(__name__)


class Endings:
    """Ends runs and frees what they held."""

    def __init__(self, ctx: SchedulerContext) -> None:
        self.ctx = ctx
        self.outbox: list[tuple[str, str]] = []  # (worker queue, message) not sent yet

    def ended(self, workflow_id: uuid.UUID, ended: bool) -> None:
        """After a workflow's end was written: wake who waits for it (``ended``), or note that
        it had ended already (a user cancelled it meanwhile)."""
        if ended:
            announce_finished(self.ctx.redis, workflow_id)
        else:
            log.info("workflow %s had already ended (cancelled?)", workflow_id)

    def completed(self, run: RunState, ended: bool) -> None:
        """The run's ending was written with its last report (``ended``: it was not over
        already)."""
        self.ctx.runs.pop(run.workflow_id, None)
        self.ended(run.workflow_id, ended)

    def fail(self, run: RunState, reason: str) -> None:
        """End the run as FAILED (unless it had ended already) and free its object."""
        log.info("workflow %s failed: %s", run.workflow_id, reason,
                 extra={"workflow_id": str(run.workflow_id)})  # fmt: skip
        self.release_object(run)
        self.ctx.runs.pop(run.workflow_id, None)
        failed = Finish(run.workflow_id, WorkflowStatus.FAILED, error=reason)
        self.ended(run.workflow_id, self.ctx.db.finish(failed))

    # ------------------------------------------------------------------ cancellation
    def check_cancelled(self, run: RunState) -> None:
        """A cancellation's wake-up: stop the run if the user did cancel it. A task out at a
        worker is let finish; its report then cleans up."""
        if self.ctx.db.status(run.workflow_id) is WorkflowStatus.CANCELLED:
            run.cancelled = True
            if run.in_flight is None:
                self.cleanup_cancelled(run)

    def cleanup_cancelled(self, run: RunState) -> None:
        self.release_object(run)
        self.ctx.runs.pop(run.workflow_id, None)
        self.ctx.db.unqueue(run.workflow_id)

    # ------------------------------------------------------------------ objects
    def release_object(self, run: RunState) -> None:
        """Free a finished workflow's object; one a worker kept is first asked back."""
        if run.data_plane != DataPlane.CDI or not run.key:
            return
        if run.owner == self.ctx.id:
            self.destroy(run.key)
            return
        # A worker holds it (affinity): a no-op instruction makes it hand the object back; the
        # report then arrives for a workflow we no longer track, and is destroyed (``Reports``).
        self.ask_back(str(run.workflow_id), run.key, run.owner)

    def ask_back(self, workflow_id: str, key: str, worker: str) -> None:
        """Send ``worker`` the no-op that makes it hand object ``key`` back to us."""
        ctx = self.ctx
        give_back = release_instruction(
            workflow_id, key, scheduler_id=ctx.id, reply_to=ctx.reply_key
        )
        queue = keys.worker_queue_key(worker)
        try:
            ctx.redis.lpush(queue, give_back.dumps())
        except redis.RedisError:
            self.outbox.append((queue, give_back.dumps()))

    def flush_outbox(self) -> None:
        """Send what Redis did not take before (a Redis error leaves the rest for later)."""
        while self.outbox:
            queue, message = self.outbox[0]
            self.ctx.redis.lpush(queue, message)
            self.outbox.pop(0)

    def drop_stale(self, report: Report) -> None:
        """The object a report of an abandoned attempt (or an ended run) names: destroyed when
        it came back to us, asked back from the worker that kept it."""
        if report.kept:
            self.ask_back(report.workflow_id, report.key, report.worker_id)
        else:
            self.destroy(report.key)

    def destroy(self, key: str) -> None:
        try:
            obj = self.ctx.cdi.use(key)
            obj.access(timeout=5).release()
            obj.destroy()
        except cdi.CDIError as exc:
            log.warning("could not destroy %s: %s", key, exc)


def completion(run: RunState, result_uri: str | None) -> Finish:
    """COMPLETED, with every task's output merged (later tasks win) and kept per step."""
    output: dict[str, Any] = {}
    for ref_output in run.outputs.values():
        output.update(ref_output)
    output["tasks"] = run.outputs
    return Finish(run.workflow_id, WorkflowStatus.COMPLETED, output=output, result_uri=result_uri)
