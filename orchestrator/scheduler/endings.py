"""How a run leaves the scheduler: completed, failed, cancelled by a user or timed out, and what
it held (CDI objects) is freed.

An ending is written with one statement (``SchedulerStore.finish``, or with the last report),
which changes nothing if the run has ended already: a user who cancelled meanwhile keeps their
word. Once the loop's turn has committed it, requests waiting on the run are told
(``contract.announce_finished``) and what the run held is freed (``context.Turn``).

A run that fails, is cancelled or passes its time limit while step runs are out stops placing
anything: each instruction no worker has taken yet is withdrawn (and what was moved to that
worker for it is taken back), each one running is stopped on its worker (a ``Stop`` on the
worker's control list: the worker interrupts the task and reports it CANCELLED or TIMED_OUT),
and once nothing is out (``quiet``) its objects are freed and its unstarted task runs marked
CANCELLED. An object a worker keeps is taken back with a no-op instruction (``hand_back``: the
worker destroys what it owns of the run and gives up its shares); one Redis does not take now
waits in ``outbox`` and goes at the next tick, so no object is left behind by a Redis outage.

An object of ours to destroy that is not back with us yet (on its way from a worker, or lost
with its host) is never waited for: the loop is single, and one wait per object, one after
another, held every run back while a host's objects were lost. It is tried again without
waiting at each tick (``retry_destroys``) until ``DESTROY_WAIT_S`` pass; one that comes back
later is the orphan sweep's (``orphans``).
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any, Final

import redis

import cdi
from cdi import ObjectKey
from orchestrator.contract import announce_finished, keys
from orchestrator.contract.messages import Report, Stop
from orchestrator.contract.vocabulary import TaskRunStatus, WorkflowStatus
from orchestrator.db.run_statements import Finish, Placement
from orchestrator.db.scheduler_store import Recorded, SchedulerStore
from orchestrator.objectstore import ObjectStore
from orchestrator.scheduler.context import SchedulerContext
from orchestrator.scheduler.data import Mode, Obj
from orchestrator.scheduler.dispatch import Dispatcher
from orchestrator.scheduler.instructions import release_instruction
from orchestrator.scheduler.planes.objects import holder
from orchestrator.scheduler.progress import Moves
from orchestrator.scheduler.runs import InFlight, Phase, RunState, StepRun
from workflows.steps import StepKind

__all__ = [
    "DESTROY_WAIT_S",
    "Endings",
    "completion",
    "described_keys",
    "ended_rows",
]

log = logging.getLogger(__name__)

DESTROY_WAIT_S: Final = 5.0  # how long an object to destroy is looked for, at each tick
_NOT_HERE: Final = "not on this host"


class Endings:
    """Ends runs and frees what they held."""

    def __init__(self, ctx: SchedulerContext, dispatch: Dispatcher) -> None:
        self.ctx = ctx
        self.dispatch = dispatch  # told of each instruction taken back from its worker
        self.outbox: list[tuple[str, bytes]] = []  # (worker queue, message) not sent yet
        self.to_destroy: dict[ObjectKey, float] = {}  # key -> monotonic time to stop looking

    def ended(self, workflow_id: uuid.UUID, ended: bool) -> None:
        """After a workflow's end was written: wake who waits for it (``ended``) once the
        turn's commit has made it durable, or note that it had ended already (a user
        cancelled it meanwhile)."""
        if ended:
            self.ctx.turn.tell(lambda: announce_finished(self.ctx.redis, workflow_id))
        else:
            log.info("workflow %s had already ended (cancelled?)", workflow_id)

    def completed(self, run: RunState, recorded: Recorded) -> None:
        """The run's ending is written with its last report (``recorded``: once it is,
        whether the run was not over already); the objects it still has (results stored,
        nothing read them) go."""
        self.release_objects(run)
        self.ctx.runs.pop(run.workflow_id, None)
        workflow_id = run.workflow_id
        recorded.then(lambda ended: self.ended(workflow_id, ended))

    def fail(self, run: RunState, reason: str) -> None:
        """End the run as FAILED (unless it had ended already); its other step runs stop."""
        log.info("workflow %s failed: %s", run.workflow_id, reason,
                 extra={"workflow_id": str(run.workflow_id)})  # fmt: skip
        failed = Finish(run.workflow_id, WorkflowStatus.FAILED, error=reason)
        self.ended(run.workflow_id, self.ctx.db.finish(failed))
        run.cancelled = True
        self.stop(run, TaskRunStatus.CANCELLED, f"stopped: the run failed ({reason})")

    def time_out(self, run: RunState) -> None:
        """End the run as TIMED_OUT (unless it had ended already), naming the steps it was
        in; those running are stopped, and report TIMED_OUT."""
        running = list(run.out())
        waiting = [s for s in run.steps.values() if s.phase is Phase.READY and not s.retry_at]
        limit = f"its time limit of {run.timeout_s:g} s" if run.timeout_s else "its time limit"
        if running:
            where = " in " + ", ".join(_attempt(s) for s in running)
        elif waiting:
            where = " while " + ", ".join(f"step {s.id!r}" for s in waiting) + " waited"
            where += f" ({waiting[0].waiting_for})" if waiting[0].waiting_for else ""
        else:
            where = ""
        reason = f"the run passed {limit}{where}"
        log.info("workflow %s %s", run.workflow_id, reason,
                 extra={"workflow_id": str(run.workflow_id)})  # fmt: skip
        steps = tuple(s.id for s in running or waiting)
        timed_out = Finish(run.workflow_id, WorkflowStatus.TIMED_OUT, error=reason, steps=steps)
        self.ended(run.workflow_id, self.ctx.db.finish(timed_out))
        run.cancelled = True
        self.stop(run, TaskRunStatus.TIMED_OUT, f"stopped: the run passed {limit}")

    # ------------------------------------------------------------------ stopping a run
    def check_cancelled(self, run: RunState) -> None:
        """A cancellation's wake-up: stop the run if the user did cancel it (its tasks out at
        workers are stopped there; their reports then clean up)."""
        if self.ctx.db.status(run.workflow_id) is WorkflowStatus.CANCELLED:
            run.cancelled = True
            self.stop(run, TaskRunStatus.CANCELLED, "stopped: the run was cancelled")

    def stop(self, run: RunState, status: TaskRunStatus, reason: str) -> None:
        """Withdraw what no worker has taken yet, stop what runs (its task runs end ``status``
        with ``reason``), then free the run once nothing is out."""
        for step in list(run.out()):
            if not self.withdraw(run, step) and step.in_flight is not None:
                self.stop_task(step.in_flight, status, reason)
        self.quiet(run)

    def stop_task(self, flight: InFlight, status: TaskRunStatus, reason: str) -> None:
        """Ask the worker running ``flight`` to stop it. A stop Redis does not take is not
        kept: the task then ends by itself, and its report is one of an ended run."""
        ins = flight.instruction
        stop = Stop(ins.task_run_id, ins.workflow_id, status, reason)
        control = keys.worker_control_key(flight.worker)
        try:
            pipe = self.ctx.redis.pipeline(transaction=False)
            pipe.lpush(control, stop.dumps())
            pipe.expire(control, keys.CONTROL_TTL_S)
            pipe.execute()
        except redis.RedisError as exc:
            log.warning("could not ask %s to stop task run %s: %s", flight.worker,
                        ins.task_run_id, exc)  # fmt: skip

    def quiet(self, run: RunState) -> None:
        """An ending run: once nothing is out, free its objects and let it go."""
        if any(True for _ in run.out()):
            return
        self.release_objects(run)
        self.ctx.runs.pop(run.workflow_id, None)
        self.ctx.db.unqueue(run.workflow_id)

    def withdraw(self, run: RunState, step: StepRun) -> bool:
        """Take a queued instruction back from its worker's queue; if it was still there (True),
        the objects moved to that worker for it are taken back too."""
        flight = step.in_flight
        assert flight is not None
        try:
            taken = self.ctx.redis.lrem(
                keys.worker_queue_key(flight.worker),
                1,
                flight.instruction.dumps(),  # type: ignore[arg-type]
            )
        except redis.RedisError as exc:
            log.warning("could not withdraw task run %s: %s", flight.task_run_id, exc)
            return False
        if not taken:
            return False  # it runs: its report comes
        self.dispatch.returned(flight)
        step.in_flight = None
        step.phase = Phase.READY
        moved = [run.objects[k] for k, m in step.modes.items() if k in run.objects]
        self.take_back(run, flight.worker, [o for o in moved if o.owner == flight.worker],
                       [o for o in moved if step.modes[o.key] is Mode.READ])  # fmt: skip
        for obj in moved:
            if step.modes[obj.key] is Mode.READ:
                obj.read_failed(flight.worker)
        return True

    # ------------------------------------------------------------------ objects
    def free(self, run: RunState, objects: list[Obj]) -> None:
        """Objects no read is left for: destroyed when ours, taken back from a worker, once
        the turn that freed them has ended (``Turn.later``; also when its writes were lost:
        the run is then resumed from Postgres, under fresh object keys)."""
        if objects:
            self.ctx.turn.later(lambda: self._free(run, objects), even_if_rolled_back=True)

    def _free(self, run: RunState, objects: list[Obj]) -> None:
        by_worker: dict[str, list[Obj]] = {}
        for obj in objects:
            if obj.readers:
                continue  # readers still at work: the orphan sweep frees it once they are done
            if obj.owner == self.ctx.id:
                self.destroy(obj.key)
            else:
                by_worker.setdefault(obj.owner, []).append(obj)
        for worker, owned in by_worker.items():
            self.take_back(run, worker, owned, [])

    def release_objects(self, run: RunState) -> None:
        """Free every object of a run that has nothing out any more."""
        objects, run.objects = list(run.objects.values()), {}
        self.free(run, objects)

    def take_back(self, run: RunState, worker: str, owned: list[Obj], shared: list[Obj]) -> None:
        """Send ``worker`` the no-op that makes it destroy ``owned`` and give up its shares
        of ``shared``."""
        if owned or shared:
            self.ask_back(str(run.workflow_id), worker, owned=owned, shared=shared)

    def ask_back(
        self,
        workflow_id: str,
        worker: str,
        key: ObjectKey = ObjectKey(""),
        *,
        owned: list[Obj] = (),  # type: ignore[assignment]
        shared: list[Obj] = (),  # type: ignore[assignment]
    ) -> None:
        """Send ``worker`` the no-op that makes it hand object ``key`` back to us, destroy
        ``owned`` and give up its shares of ``shared``."""
        ctx = self.ctx
        give_back = release_instruction(
            workflow_id,
            key,
            scheduler_id=ctx.id,
            reply_to=ctx.reply_key,
            owned=tuple((o.key, str(o.kind)) for o in owned),
            shared=tuple((o.key, str(o.kind)) for o in shared),
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
        """The objects a report of an abandoned attempt (or an ended run) names: destroyed when
        they came back to us, taken back from the worker that kept them (or got them handed
        on)."""
        made = [report.key] if report.key else []
        made += [k for d in report.objects.values() for k in described_keys(d)]
        for key in dict.fromkeys([*made, *report.returned]):
            owner = holder(self.ctx, report, key) if key in made else self.ctx.id
            if owner == self.ctx.id:
                self.destroy(key)
            else:
                self.ask_back(report.workflow_id, owner, key)

    def destroy(self, key: ObjectKey) -> None:
        """Destroy an object of ours now if it is with us; else look for it again at the next
        ticks (``retry_destroys``), never waiting for it here."""
        if self._destroy_now(key) is not None:
            self.to_destroy.setdefault(key, time.monotonic() + DESTROY_WAIT_S)

    def retry_destroys(self) -> None:
        """Each tick: destroy the objects that came back since; stop looking for those that
        did not within ``DESTROY_WAIT_S`` (the orphan sweep frees one that comes later)."""
        now = time.monotonic()
        for key, give_up_at in list(self.to_destroy.items()):
            elsewhere = self._destroy_now(key)
            if elsewhere is None or now >= give_up_at:
                del self.to_destroy[key]
            if elsewhere is not None and now >= give_up_at:
                # Held by another container: worth a line. Not found on any host of ours: it
                # was never made, or was lost with its host; nothing is left to free.
                level = logging.DEBUG if elsewhere == _NOT_HERE else logging.INFO
                log.log(level, "object %s did not come back to be destroyed within %g s (%s); "
                        "the orphan sweep frees it if it does", key, DESTROY_WAIT_S,
                        elsewhere)  # fmt: skip

    def _destroy_now(self, key: ObjectKey) -> str | None:
        """Destroy ``key`` if it is ours now, without waiting: None when that is done (or can
        never be), else what keeps it (another owner, a share, not here yet)."""
        try:
            obj = self.ctx.cdi.use(key, check=False)
            obj.access(timeout=0).release()
            obj.destroy()
        except (cdi.NotOwner, cdi.ObjectShared) as exc:
            return str(exc)  # not (yet) with us: another owner, or a reader's share
        except cdi.ObjectNotFound:
            # On one host, gone for good; with several, it may be on its way from another.
            return _NOT_HERE if self.ctx.cdi.spans_hosts else None
        except cdi.MinionUnavailable as exc:
            return str(exc)  # the tick's minion check follows; a restarted one holds nothing
        except cdi.CDIError as exc:
            log.warning("could not destroy %s: %s", key, exc)
        return None


def _attempt(step: StepRun) -> str:
    """``step 'nap' (attempt 2, on worker-1)`` for a step run out at a worker."""
    flight = step.in_flight
    assert flight is not None
    return f"step {step.id!r} (attempt {flight.instruction.attempt}, on {flight.worker})"


def described_keys(described: Any) -> list[ObjectKey]:
    """The keys of a named output as a report describes it (``Report.objects``)."""
    if isinstance(described, dict) and "items" in described:
        return [k for item in described["items"] for k in described_keys(item)]
    if isinstance(described, dict) and "key" in described:
        return [ObjectKey(str(described["key"]))]
    return []


def completion(run: RunState, objects: ObjectStore) -> Finish:
    """COMPLETED: every task's JSON output merged (later steps win) and kept per step run, the
    results stored in S3 by name, and ``result_uri`` the image result when there is one."""
    output: dict[str, Any] = {}
    for step_id, step_output in run.outputs.items():
        step = run.steps.get(step_id)
        if step is not None and not step.node.is_switch:
            output.update(step_output)
    output["tasks"] = run.outputs
    images = [u for name, u in run.results.items() if name.endswith(".image")]
    if run.results:
        output["results"] = run.results
    return Finish(
        run.workflow_id,
        WorkflowStatus.COMPLETED,
        output=output,
        result_uri=images[0] if len(images) == 1 else None,
    )


def ended_rows(db: SchedulerStore, run: RunState, moves: Moves) -> list[Placement]:
    """The task runs of steps that ended without a worker: skipped ones, and switches."""
    now = time.time()
    rows = [
        Placement(db.next_task_run_id(), run.workflow_id, step.id,
                  step.spec.task if step.spec is not None else StepKind.SWITCH, step.attempt,
                  None, now,
                  status=TaskRunStatus.SKIPPED)
        for step in moves.skipped
    ]  # fmt: skip
    rows += [
        Placement(db.next_task_run_id(), run.workflow_id, step.id, StepKind.SWITCH, step.attempt,
                  None, now, status=TaskRunStatus.COMPLETED, output=output)
        for step, output in moves.switched
    ]  # fmt: skip
    return rows
