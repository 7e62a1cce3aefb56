"""What the scheduler notices on its tick when something failed outside it: a worker that died
or went silent with a task, and a Redis that lost its data.

*Lost workers.* A worker whose heartbeat is older than ``keys.WORKER_DEAD_AFTER_S``, or that
restarted (a new ``started_at``), or a task past its timeout plus ``LOST_GRACE_S``: the
scheduler waits briefly for the run's object to come back by the minion's recovery rule (if the
worker still holds it, it is alive after all; one the directory places on the worker's other
host is not waited for, the next tick looks again), drops what it may have half-written,
records the task run as lost and retries the step elsewhere. Before it declares anything lost
it reads the reports already waiting: a worker whose task overran its timeout reports TIMED_OUT
and exits, and its restart could otherwise be seen before its report. A task past its deadline
on a live worker that still holds the object (its report, or the instruction, may have been
lost) is sent once more; a worker answers a repeat with its report, not a second run. If that
brings nothing either, the run is driven again from its input (``redrive``).

What a worker held ahead of the step that reads it (a join's input handed on to the join's
worker, which has not started it) has no task in flight there: each tick compares its owner's
``started_at`` with the one it was given under and takes it back from a worker that died or
started again (``ahead``); the step that reads it is then placed with it moved on.

*Redis data loss.* Redis holds only what can be rebuilt; when its ``keys.EPOCH`` token changes,
the scheduler sends again every instruction it has out, and presumes no worker dead for a
heartbeat's lifetime (their heartbeats went with the data and come back within it).
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from collections.abc import Mapping

from orchestrator.contract import keys
from orchestrator.scheduler import ahead, progress
from orchestrator.scheduler.context import SchedulerContext
from orchestrator.scheduler.data import Mode
from orchestrator.scheduler.dispatch import LOST_GRACE_S, Dispatcher
from orchestrator.scheduler.placement import WorkerLoad
from orchestrator.scheduler.planes import plane_of
from orchestrator.scheduler.redrive import Redrive
from orchestrator.scheduler.reports import Reports
from orchestrator.scheduler.runs import InFlight, RunState, StepRun

__all__ = ["Recovery"]

log = logging.getLogger(__name__)


class Recovery:
    """Finds the tasks lost with their workers, and what Redis lost."""

    def __init__(
        self, ctx: SchedulerContext, dispatch: Dispatcher, reports: Reports, redrive: Redrive
    ) -> None:
        self.ctx = ctx
        self.dispatch = dispatch
        self.reports = reports
        self.redrive = redrive
        self._redis_epoch: str | None = None
        self._beats_grace_until = 0.0  # monotonic: Redis lost its data, heartbeats come back

    # ------------------------------------------------------------------ lost workers
    def check_in_flight(self) -> None:
        """A task whose worker went silent: take its objects back and retry elsewhere."""
        now = time.monotonic()
        loads = {w.worker_id: w for w in self.dispatch.loads()}
        grace = now < self._beats_grace_until
        suspects = [
            (run, step)
            for run in self.ctx.runs.values()
            for step in run.out()
            if _silence(step, loads, now, grace) is not None
        ]
        if suspects:
            # A worker that reports and then exits (a task overran its timeout) is restarted
            # before this loop may have read the report: read what has arrived first, or
            # the attempt would be recorded as lost instead of with its own outcome.
            self._take_arrived_reports()
        for run, step in suspects:
            if self.ctx.runs.get(run.workflow_id) is not run:
                continue  # a report ended the run meanwhile
            dead = _silence(step, loads, now, grace)
            flight = step.in_flight
            if dead is None or flight is None:
                continue  # its report had arrived
            if not plane_of(run).regain(self.ctx, run, step, flight, self.reports.endings.destroy):
                # The worker still holds an object of the step: it is alive after all. If it
                # is overdue, its report (or our instruction) may have been lost.
                if not dead:
                    self._overdue(run, step, flight, now)
                continue
            self._give_up(run, step, flight, dead, loads)
        if not grace:
            self._regain_ahead(loads)

    def _regain_ahead(self, loads: Mapping[str, WorkerLoad]) -> None:
        """Take back what workers that died or started again held ahead of the steps that
        read it (``ahead``): those steps are then placed with it moved on. A run one of whose
        objects is gone is driven again."""
        for run in list(self.ctx.runs.values()):
            held = ahead.stale(self.ctx, run, loads)
            gone = ahead.regain(self.ctx, run, held, loads) if held else []
            if gone:
                self.redrive.run(run, f"object {gone[0].key} held by {gone[0].owner} is gone")

    def _overdue(self, run: RunState, step: StepRun, flight: InFlight, now: float) -> None:
        """No report past the deadline from a live worker that keeps the step's objects: send
        the instruction once more; if that brings nothing either, drive the run again."""
        if flight.resent:
            self.redrive.run(
                run, f"worker {flight.worker} sent no report for task run "
                f"{flight.task_run_id}, even when asked again",
            )  # fmt: skip
            return
        deadline = now + step.current.timeout_s + LOST_GRACE_S
        step.in_flight = dataclasses.replace(flight, resent=True, deadline=deadline)
        log.warning("no report for task run %s from %s in time; sending it again",
                    flight.task_run_id, flight.worker)  # fmt: skip
        self.ctx.redis.lpush(keys.worker_queue_key(flight.worker), flight.instruction.dumps())

    def _give_up(
        self,
        run: RunState,
        step: StepRun,
        flight: InFlight,
        dead: bool,
        loads: Mapping[str, WorkerLoad],
    ) -> None:
        """Record the task as lost, withdraw its instruction, and retry the step elsewhere.
        One its worker's process never popped (that process lives on, only slow or its
        heartbeat late) still holds the shares it was given for it: they are asked back, as a
        withdrawal does (``Endings.withdraw``), or that worker would hold them for as long as
        it lives and the object's last read, which takes the object over, would be refused
        (``ObjectShared``) every time."""
        self.dispatch.returned(flight)
        step.in_flight = None
        reason = (
            f"worker {flight.worker} died"
            if dead
            else f"no report within {step.current.timeout_s + LOST_GRACE_S:.0f} s"
        )
        lane = run.objects.get(flight.instruction.key) if flight.instruction.key else None
        held = lane is not None and bool(lane.held) and bool(flight.instruction.held)
        if held and lane is not None:
            reason += (
                f"; it held the image of step {lane.held_chain[0]!r} on in memory, so the "
                "workflow goes on from that step again"
            )
        self.ctx.db.task_run_lost(flight.task_run_id, reason)
        # Withdraw this instruction wherever it still sits, so a restarted worker of the
        # same id does not run it too; other runs' instructions stay where they are.
        lost_text = flight.instruction.dumps()
        pipe = self.ctx.redis.pipeline(transaction=False)
        pipe.lrem(keys.worker_queue_key(flight.worker), 0, lost_text)  # type: ignore[arg-type]
        pipe.lrem(keys.worker_inflight_key(flight.worker), 0, lost_text)  # type: ignore[arg-type]
        unrun = bool(pipe.execute()[0])
        if unrun and _same_process(flight, loads):
            shared = [run.objects[k] for k, m in step.modes.items()
                      if m is Mode.READ and k in run.objects]  # fmt: skip
            self.reports.endings.take_back(run, flight.worker, [], shared)
        step.avoid = step.avoid | {flight.worker}
        step.last_worker = None
        if run.home == flight.worker:
            run.home = None  # affinity: the next step chooses a new worker
        if held and lane is not None:
            # The image it held died with it: recompute it, elsewhere.
            for again in progress.rewind(run, lane, reader=step):
                again.avoid = again.avoid | {flight.worker}
            self.reports.after_lost_image(run, step)
            return
        self.reports.after_failure(run, step, reason, retryable=True, lost=True)

    def _take_arrived_reports(self) -> None:
        """Handle every report already waiting on our list, without blocking."""
        while texts := self.reports.take()[0]:
            self.reports.read_all(texts)

    # ------------------------------------------------------------------ Redis data loss
    def check_redis_epoch(self) -> None:
        """Redis holds only what can be rebuilt: if it lost everything, push what we sent."""
        raw = self.ctx.redis.get(keys.EPOCH)
        if raw is None:
            self.ctx.redis.set(keys.EPOCH, uuid.uuid4().hex, nx=True)
            raw = self.ctx.redis.get(keys.EPOCH)
        epoch = str(raw)
        if self._redis_epoch is not None and epoch != self._redis_epoch:
            log.warning("Redis lost its data; re-sending in-flight instructions")
            self._beats_grace_until = time.monotonic() + keys.WORKER_DEAD_AFTER_S
            for run in self.ctx.runs.values():
                for step in run.out():
                    flight = step.in_flight
                    assert flight is not None
                    self.ctx.redis.lpush(
                        keys.worker_queue_key(flight.worker), flight.instruction.dumps()
                    )
        self._redis_epoch = epoch


def _same_process(flight: InFlight, loads: Mapping[str, WorkerLoad]) -> bool:
    """Whether the process ``flight`` went to still runs its worker (a new one, or none,
    holds nothing of the old one's: its shares ended with it)."""
    load = loads.get(flight.worker)
    return load is not None and load.started_at == flight.worker_started


def _silence(
    step: StepRun, loads: Mapping[str, WorkerLoad], now: float, grace: bool = False
) -> bool | None:
    """For a step run with a task in flight whose worker is gone (True) or overdue (False);
    None while it may still report (``grace``: a worker with no heartbeat may still be alive)."""
    flight = step.in_flight
    if flight is None:
        return None
    if grace and flight.worker not in loads:
        return None
    worker = loads.get(flight.worker)
    restarted = worker is not None and worker.started_at != flight.worker_started
    dead = worker is None or not worker.alive or restarted
    if not dead and now < flight.deadline:
        return None
    return dead
