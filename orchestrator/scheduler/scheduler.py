"""The scheduler: turns wake-ups and worker reports into placements (paper section V-D).

One thread runs the state machine (claims, placements, reports, retries, health checks) and is
the only one writing this scheduler's task runs to Postgres. It touches no image: the first
task's worker fetches the input from S3, and the last task's worker stores the result.

Ownership of a workflow's CDI object: the first task's worker creates it from the input, with
the scheduler as its recovery container, and the scheduler transfers it to the worker of each
later task that runs elsewhere. Under ``affinity`` the worker keeps it until the last task;
otherwise it hands it back with its report. A worker that dies hands it back too, by the
minion's recovery rule, so a retry always starts from an intact object (or, if it died while
making it, from the input in S3 again). Under
``affinity`` the worker may also hold a task's new image in memory instead of writing it
(``Instruction.hold``); if that image is lost, the run goes back to the first step whose image
was held and recomputes it from the object (``RunState.follow_held``).
"""

from __future__ import annotations

import functools
import logging
import math
import random
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import redis

import cdi
from orchestrator.contract import announce_finished, keys, read_wake
from orchestrator.contract.messages import Instruction, Report
from orchestrator.contract.vocabulary import DataPlane, Policy, TaskRunStatus, WorkflowStatus
from orchestrator.db.run_statements import Claimed, Finish, Handoff, Placement
from orchestrator.db.scheduler_store import SchedulerStore
from orchestrator.errors import OrchestratorError
from orchestrator.objectstore import ObjectStore
from orchestrator.scheduler.placement import choose_worker, read_workers
from orchestrator.scheduler.runs import RunState, StepSpec
from orchestrator.settings import Settings
from workflows import imagebuf
from workflows.definitions import chain_problems

__all__ = ["REDIS_RETRY_S", "Scheduler", "connect_redis"]

log = logging.getLogger(__name__)

# Housekeeping: claims a wake-up missed, lost workers, a Redis that lost its data, runs waiting
# for room. *Why 1 s, not less:* each tick costs a claim statement and Redis round trips even
# when nothing happens (4 ticks a second were the idle scheduler's whole CPU); new workflows
# and reports wake the loop at once, and a retry that falls due brings the tick forward.
TICK_S = 1.0
CLAIM_BATCH = 32
LOST_GRACE_S = 5.0  # beyond a task's timeout before its silent worker is presumed gone
RECLAIM_AFTER_S = 60.0  # a claim older than this without progress is taken over
RELEASE_TASK = "workflows.image_tasks:noop"  # what a worker runs to hand an object back
# With a backlog, claim again once this many runs have ended (a claim per run would cost a
# round trip per workflow; the tick claims anyway every TICK_S).
CLAIM_AGAIN_AT = 8
BEATS_TTL_S = 0.5  # heartbeats are re-read at most this often (workers beat every 2 s)
_MIN_WAIT_S = 0.01  # Redis reads a blocking timeout of 0 as "forever"
REDIS_RETRY_S = 0.5  # after a Redis connection error, the loop waits this long and tries again


def connect_redis(url: str) -> redis.Redis:
    """The loop's Redis client: one connection, as the loop thread is its only user. *Why:*
    redis-py's pool takes a connection and gives it back around every command (redis-py 8.1),
    CPU the scheduler spends on every workflow. Unlike a pooled one,
    a lone connection that Redis dropped fails its next command (and then reconnects): the
    loop takes that as a Redis error and goes on."""
    return redis.Redis.from_url(url, decode_responses=True, single_connection_client=True)


class Scheduler:
    def __init__(
        self,
        scheduler_id: str,
        settings: Settings,
        db: SchedulerStore,
        redis_client: redis.Redis,
        cdi_client: cdi.Client,
        objects: ObjectStore,
    ) -> None:
        self.id = scheduler_id
        self.settings = settings
        self.db = db
        self.redis = redis_client
        self.cdi = cdi_client
        self.objects = objects
        self.reply_key = keys.scheduler_reports_key(scheduler_id)
        self.runs: dict[uuid.UUID, RunState] = {}
        self._in_flight: dict[str, int] = defaultdict(int)
        self._task_s: dict[str, float] = defaultdict(lambda: 0.05)  # EWMA run time per task
        # Runs whose current step waits for a worker (none alive, or none with room: see
        # ``placement``), oldest first.
        self._waiting: dict[uuid.UUID, RunState] = {}
        self._redis_epoch: str | None = None
        self._stopping = False
        self._rng = random.Random()
        self._beats: dict[str, dict[str, str]] = {}
        self._beats_read = -math.inf  # monotonic time of the last heartbeat read
        self._backlog = False  # PENDING workflows may be waiting for room
        self._next_tick = 0.0  # monotonic

    # ------------------------------------------------------------------ loop
    def run_forever(self) -> None:
        log.info("scheduler %s started", self.id)
        self._resume_own_runs()
        while not self._stopping:
            self._step()
        self.db.close()
        log.info("scheduler %s stopped", self.id)

    def _step(self) -> None:
        """One turn of the loop: a report or wake-up (waiting for one until the next tick is
        due), then whatever it made possible."""
        wait_s = max(_MIN_WAIT_S, self._next_tick - time.monotonic())
        try:
            popped = self.redis.brpop([self.reply_key, keys.WAKE], timeout=wait_s)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            # Redis restarted or dropped our connection: the next command reconnects. What
            # it lost is noticed by the tick's epoch check; what a wake-up missed, by its claim.
            log.warning(
                "Redis failed the loop's read (%s); trying again in %g s", exc, REDIS_RETRY_S
            )
            time.sleep(REDIS_RETRY_S)
            popped = None
        if popped is not None:
            key, value = str(popped[0]), str(popped[1])
            if key == self.reply_key:
                self._on_report_text(value)
            else:
                self._on_wake(value)
            if self._waiting:
                self._dispatch_waiting()  # a report may have freed a slot
        again_at = min(CLAIM_AGAIN_AT, self.settings.max_active_workflows)
        if self._backlog and self._claim_room() >= again_at:
            self._guarded(self._claim)  # runs ended: take the next ones waiting
        if time.monotonic() >= self._next_tick:
            self._next_tick = time.monotonic() + TICK_S
            self._tick()

    def stop(self) -> None:
        self._stopping = True

    def _claim_room(self) -> int:
        return self.settings.max_active_workflows - len(self.runs)

    def _guarded(self, action: Callable[[], None]) -> None:
        try:
            action()
        except Exception:  # one bad workflow must not stop the others
            log.exception("scheduler step failed")

    def _tick(self) -> None:
        self._guarded(self._check_redis_epoch)
        self._guarded(self._claim)
        self._guarded(self._check_in_flight)
        now = time.monotonic()
        for run in list(self.runs.values()):
            if run.retry_at and run.retry_at <= now:
                run.retry_at = 0.0
                self._guarded(functools.partial(self._dispatch, run))
        self._dispatch_waiting()

    def _dispatch_waiting(self) -> None:
        """Place waiting runs, oldest first, while workers have room. A sweep tries one run per
        (task, policy, previous worker): the others like it would be refused the same way."""
        refused: set[tuple[str, str, str | None]] = set()
        for run in list(self._waiting.values()):
            if run.cancelled or self.runs.get(run.workflow_id) is not run:
                self._waiting.pop(run.workflow_id, None)
                continue
            like = (run.current.task, run.policy, run.last_worker)
            if like in refused:
                continue
            self._guarded(functools.partial(self._dispatch, run))
            if run.workflow_id in self._waiting:
                refused.add(like)

    # ------------------------------------------------------------------ claiming
    def _on_wake(self, value: str) -> None:
        wake = read_wake(value)
        run = None if wake.workflow_id is None else self.runs.get(wake.workflow_id)
        if run is None:
            self._claim()  # a new or retried run (a cancelled PENDING one is simply not claimed)
        elif wake.cancel:
            self._check_cancelled(run)
        # else: a new run that an earlier claim already took, with others, in one batch

    def _claim(self) -> None:
        """Take PENDING workflows while fewer than ``max_active_workflows`` are ours."""
        room = self.settings.max_active_workflows - len(self.runs)
        if room <= 0:
            self._backlog = True
            return
        want = min(CLAIM_BATCH, room)
        claims = self.db.claim(self.id, want, RECLAIM_AFTER_S)
        self._backlog = len(claims) == want  # a full batch: more may be waiting
        self._take(claims)

    def _resume_own_runs(self) -> None:
        """After a restart our CDI objects are gone: start our RUNNING workflows over."""
        self._take(self.db.resume(self.id))

    def _take(self, claims: list[Claimed]) -> None:
        """Run claimed workflows; one that cannot run fails with the reason."""
        for claimed in claims:
            try:
                run = _plan(claimed)
            except OrchestratorError as exc:
                failed = Finish(claimed.id, WorkflowStatus.FAILED, error=str(exc))
                self._ended(claimed.id, self.db.finish(failed))
                continue
            self.runs[run.workflow_id] = run
            self._dispatch(run)

    # ------------------------------------------------------------------ placement
    def _dispatch(self, run: RunState) -> None:
        if run.cancelled or run.workflow_id not in self.runs:
            return
        placement = self._choose(run)
        if placement is not None:
            self._send(placement.worker, self._placed(run, placement))
            self.db.place(placement)

    def _send(self, worker: str, instruction: Instruction) -> None:
        """Push *before* the task run is recorded: the record overlaps the worker's run. Its
        report waits in our list until this loop thread, the one recording, reads it."""
        self.redis.lpush(keys.worker_queue_key(worker), instruction.dumps())

    def _choose(self, run: RunState) -> Placement | None:
        """Choose the worker for the current step and move the object to it: the task run to
        record; ``None`` while no worker is alive."""
        step = run.current
        loads = self._workers()
        worker = choose_worker(
            loads,
            run.policy,
            run.last_worker,
            task_s=self._task_s[step.task],
            nbytes=run.nbytes,
            rng=self._rng,
            avoid=run.avoid,
        )
        if worker is None:
            self._waiting.setdefault(run.workflow_id, run)
            return None
        self._waiting.pop(run.workflow_id, None)
        handoff = None
        if run.data_plane == DataPlane.CDI and run.key and run.owner != worker:
            handoff = Handoff(self.id, worker, run.nbytes, self._transfer(run, worker))
        run.in_flight_worker_started = next(
            (w.started_at for w in loads if w.worker_id == worker), 0.0
        )
        return Placement(
            self.db.next_task_run_id(),
            run.workflow_id,
            step.ref,
            step.task,
            run.attempt,
            worker,
            time.time(),
            handoff,
        )

    def _placed(self, run: RunState, placement: Placement) -> Instruction:
        """The instruction to send for ``placement``, and the run's new state."""
        step, worker = run.current, placement.worker
        instruction = self._instruction(run, step, worker, placement)
        run.in_flight, run.in_flight_worker = instruction, worker
        run.attempts[step.ref] = run.attempt  # a recomputed step's attempts go on from here
        run.deadline = time.monotonic() + step.timeout_s + LOST_GRACE_S
        run.last_worker = worker
        self._in_flight[worker] += 1
        return instruction

    def _transfer(self, run: RunState, worker: str) -> float:
        started = time.perf_counter_ns()
        self.cdi.use(run.key, check=False).transfer(worker)
        run.owner = worker
        return (time.perf_counter_ns() - started) / 1000

    def _instruction(
        self, run: RunState, step: StepSpec, worker: str, placement: Placement
    ) -> Instruction:
        common: dict[str, Any] = dict(
            task_run_id=placement.task_run_id,
            workflow_id=str(run.workflow_id),
            ref=step.ref,
            task=step.module,
            attempt=run.attempt,
            timeout_s=step.timeout_s,
            reply_to=self.reply_key,
            data_plane=run.data_plane,
            params=step.params,
            data=run.data,
            queued_at=placement.queued_at,
        )
        if run.data_plane == DataPlane.NONE:
            return Instruction(**common)
        if run.data_plane == DataPlane.CDI:
            last = run.last_step
            keep = run.policy == Policy.AFFINITY and not last
            fetch = not run.key  # no object yet: the worker makes it from the S3 input
            return Instruction(
                **common,
                key=run.next_object_key() if fetch else run.key,
                input_uri=run.input_uri if fetch else "",
                output_key=run.next_object_key(),
                keep=keep,
                # Only a step that may run again: a lost held image is recomputed.
                hold=keep and step.retries > 0,
                held=run.held,
                return_to=self.id,
                # The last task's worker stores the result: no copy into an object, no
                # hand-back, and the workflow ends with the report's own statement.
                output_uri=self.objects.uri(_result_key(run)) if last else "",
                output_format=run.result_format if last else "png",
            )
        return Instruction(
            **common,
            input_uri=run.current_uri,
            output_uri=self.objects.uri(_result_key(run))
            if run.last_step
            else self._output_uri_of(run, step),
            output_format=run.result_format if run.last_step else run.intermediate_format,
        )

    def _workers(self) -> list[Any]:
        """Live worker loads: heartbeats (re-read at most every ``BEATS_TTL_S``: workers beat
        every 2 s, so reading them per placement only cost round trips) plus our in-flight
        counts, which are always current."""
        now = time.monotonic()
        if now - self._beats_read >= BEATS_TTL_S:
            ids = sorted(str(i) for i in self.redis.smembers(keys.WORKERS))
            pipe = self.redis.pipeline(transaction=False)
            for worker_id in ids:
                pipe.hgetall(keys.worker_key(worker_id))
            self._beats = {
                w: {str(k): str(v) for k, v in h.items()}
                for w, h in zip(ids, pipe.execute(), strict=True)
                if h
            }
            self._beats_read = now
        return read_workers(self._beats, self._in_flight, keys.WORKER_DEAD_AFTER_S)

    # ------------------------------------------------------------------ reports
    def _on_report_text(self, text: str) -> None:
        try:
            report = Report.loads(text)
        except (ValueError, TypeError):
            log.warning("dropping an unreadable report: %.200s", text)
            return
        self._guarded(lambda: self._on_report(report))

    def _on_report(self, report: Report) -> None:
        run = self.runs.get(uuid.UUID(report.workflow_id))
        if run is None or run.in_flight is None or run.in_flight.task_run_id != report.task_run_id:
            log.info("stale report for task run %s", report.task_run_id)
            if report.key and not report.kept and run is None:
                self._destroy(report.key)  # its workflow is over: the object came back to die
            return
        self._in_flight[run.in_flight_worker] -= 1
        run.in_flight = None
        completed = report.status == TaskRunStatus.COMPLETED
        if run.data_plane == DataPlane.CDI:
            run.key = "" if report.stored else report.key or run.key
            run.owner = report.worker_id if report.kept else self.id
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
        step = run.current
        all_done = completed and run.last_step
        if completed:
            run_s = max(0.0, report.finished_at - report.started_at)
            self._task_s[step.task] = 0.8 * self._task_s[step.task] + 0.2 * run_s
            run.outputs[step.ref] = report.output
            if run.data_plane == DataPlane.CDI:
                # What the next hand-off moves: the new image, or the input a reader passes on.
                run.nbytes = report.bytes_out or report.bytes_in or run.nbytes
            if run.data_plane == DataPlane.OBJECT_STORE:
                run.current_uri = self._output_uri_of(run, step)
        back = None
        if report.kept is False and run.data_plane == DataPlane.CDI and report.key:
            back = Handoff(
                report.worker_id, self.id, report.bytes_out or run.nbytes, report.return_us
            )
        placement = finish = None
        if completed and not run.cancelled and not all_done:
            run.advance()
            placement = self._choose(run)
        elif all_done and not run.cancelled and (run.data_plane != DataPlane.CDI or report.stored):
            # Nothing left to store (dataless, or the last task stored the result itself).
            result = (
                None if run.data_plane == DataPlane.NONE else self.objects.uri(_result_key(run))
            )
            finish = _completion(run, result)
        if placement is not None:
            self._send(placement.worker, self._placed(run, placement))
        # One statement records the report and the next step's placement, or ends the workflow.
        ended = self.db.report(report, back, placement, finish)
        if not completed:
            self._after_failure(run, report.error or report.status, report.retryable)
        elif run.cancelled:
            self._cleanup_cancelled(run)
        elif finish is not None:
            self.runs.pop(run.workflow_id, None)
            self._ended(run.workflow_id, ended)
        elif all_done:
            # A worker that kept the last image to itself: it predates storing results.
            self._fail(
                run,
                f"worker {report.worker_id} completed the last task without storing the "
                "result; run workers of the scheduler's version (they are upgraded together)",
            )

    def _output_uri_of(self, run: RunState, step: StepSpec) -> str:
        extension = imagebuf.RESULT_FORMATS[run.intermediate_format].extension
        return self.objects.uri(f"work/{run.workflow_id}/{step.ref}-{run.attempt}{extension}")

    def _after_failure(self, run: RunState, reason: str, retryable: bool) -> None:
        step = run.current
        if run.cancelled:
            self._cleanup_cancelled(run)
        elif retryable and run.attempt <= step.retries:
            run.retry_at = time.monotonic() + step.retry_backoff_s * 2 ** (run.attempt - 1)
            run.attempt += 1
            self._next_tick = min(self._next_tick, run.retry_at)  # the tick dispatches it
        else:
            self._fail(run, f"task {step.ref!r} failed after {run.attempt} attempt(s): {reason}")

    # ------------------------------------------------------------------ health
    def _check_in_flight(self) -> None:
        """A task whose worker went silent: take the object back and retry elsewhere."""
        now = time.monotonic()
        loads = {w.worker_id: w for w in self._workers()}
        suspects = [r for r in self.runs.values() if self._silence(r, loads, now) is not None]
        if suspects:
            # A worker that reports and then exits (a task overran its timeout) is restarted
            # before this loop may have read the report: read what has arrived first, or
            # the attempt would be recorded as lost instead of with its own outcome.
            self._take_arrived_reports()
        for run in suspects:
            dead = self._silence(run, loads, now)
            if dead is None or run.in_flight is None:
                continue  # its report had arrived (or the next task is on a live worker)
            if run.data_plane == DataPlane.CDI and not self._regain(run):
                continue  # the worker still holds the object: it is alive after all
            task_run_id = run.in_flight.task_run_id
            lost_text = run.in_flight.dumps()
            self._in_flight[run.in_flight_worker] -= 1
            run.in_flight = None
            reason = (
                f"worker {run.in_flight_worker} died"
                if dead
                else f"no report within {run.current.timeout_s + LOST_GRACE_S:.0f} s"
            )
            if run.held:
                reason += (
                    f"; it held the image of step {run.steps[run.held_from].ref!r} on in memory, "
                    "so the workflow goes on from that step again"
                )
            self.db.task_run_lost(task_run_id, reason)
            # Withdraw this instruction wherever it still sits, so a restarted worker of the
            # same id does not run it too; other runs' instructions stay where they are.
            pipe = self.redis.pipeline(transaction=False)
            pipe.lrem(keys.worker_queue_key(run.in_flight_worker), 0, lost_text)
            pipe.lrem(keys.worker_inflight_key(run.in_flight_worker), 0, lost_text)
            pipe.execute()
            run.avoid = run.avoid | {run.in_flight_worker}
            run.last_worker = None
            if run.held:
                run.rewind()  # the image it held died with it: recompute it from the object
            self._after_failure(run, reason, retryable=True)

    def _silence(self, run: RunState, loads: dict[str, Any], now: float) -> bool | None:
        """For a run with a task in flight whose worker is gone (True) or overdue (False);
        None while it may still report."""
        if run.in_flight is None:
            return None
        worker = loads.get(run.in_flight_worker)
        restarted = worker is not None and worker.started_at != run.in_flight_worker_started
        dead = worker is None or not worker.alive or restarted
        if not dead and now < run.deadline:
            return None
        return dead

    def _take_arrived_reports(self) -> None:
        """Handle every report already waiting on our list, without blocking."""
        while (text := self.redis.rpop(self.reply_key)) is not None:
            self._on_report_text(str(text))

    def _regain(self, run: RunState) -> bool:
        """Wait briefly for the object to come back by the minion's recovery rule; False while
        the worker still holds it (then it is alive after all). An object the worker was
        making from the S3 input may be half-written: it is dropped like a half-written output,
        and the retry fetches the input again."""
        lost = run.in_flight
        fetched = lost.key if lost is not None and lost.input_uri else ""
        try:
            with self.cdi.use(fetched or run.key).view(timeout=2):
                pass
        except cdi.AccessTimeout:
            return False
        except cdi.ObjectNotFound:
            pass
        if fetched:
            self._drop_orphan(fetched)
        else:
            run.owner = self.id
        if lost is not None and lost.output_key:
            self._drop_orphan(lost.output_key)
        return True

    def _drop_orphan(self, key: str) -> None:
        """A half-written object of a dead worker (its output, or the object it was making from
        the input) came back to us too: destroy it."""
        try:
            orphan = self.cdi.use(key)
            orphan.access(timeout=1).release()
            orphan.destroy()
        except cdi.CDIError:
            pass  # it never got created, or is already gone

    def _check_redis_epoch(self) -> None:
        """Redis holds only what can be rebuilt: if it lost everything, push what we sent."""
        raw = self.redis.get(keys.EPOCH)
        if raw is None:
            self.redis.set(keys.EPOCH, uuid.uuid4().hex, nx=True)
            raw = self.redis.get(keys.EPOCH)
        epoch = str(raw)
        if self._redis_epoch is not None and epoch != self._redis_epoch:
            log.warning("Redis lost its data; re-sending in-flight instructions")
            for run in self.runs.values():
                if run.in_flight is not None:
                    self.redis.lpush(
                        keys.worker_queue_key(run.in_flight_worker), run.in_flight.dumps()
                    )
        self._redis_epoch = epoch

    # ------------------------------------------------------------------ endings
    def _check_cancelled(self, run: RunState) -> None:
        if self.db.status(run.workflow_id) is WorkflowStatus.CANCELLED:
            run.cancelled = True
            if run.in_flight is None:
                self._cleanup_cancelled(run)

    def _cleanup_cancelled(self, run: RunState) -> None:
        self._release_object(run)
        self.runs.pop(run.workflow_id, None)
        self.db.unqueue(run.workflow_id)

    def _release_object(self, run: RunState) -> None:
        """Free a finished workflow's object; one a worker kept is first asked back."""
        if run.data_plane != DataPlane.CDI or not run.key:
            return
        if run.owner == self.id:
            self._destroy(run.key)
            return
        # A worker holds it (affinity): a no-op instruction makes it hand the object back; the
        # report then arrives for a workflow we no longer track, and _on_report destroys it.
        give_back = Instruction(
            task_run_id=0,
            workflow_id=str(run.workflow_id),
            ref="release",
            task=RELEASE_TASK,
            attempt=1,
            timeout_s=30,
            reply_to=self.reply_key,
            data_plane=DataPlane.CDI,
            key=run.key,
            keep=False,
            return_to=self.id,
            queued_at=time.time(),
        )
        self.redis.lpush(keys.worker_queue_key(run.owner), give_back.dumps())

    def _destroy(self, key: str) -> None:
        try:
            obj = self.cdi.use(key)
            obj.access(timeout=5).release()
            obj.destroy()
        except cdi.CDIError as exc:
            log.warning("could not destroy %s: %s", key, exc)

    def _ended(self, workflow_id: uuid.UUID, ended: bool) -> None:
        """After a workflow's end was written: wake who waits for it (``ended``), or note that
        it had ended already (a user cancelled it meanwhile)."""
        if ended:
            announce_finished(self.redis, workflow_id)
        else:
            log.info("workflow %s had already ended (cancelled?)", workflow_id)

    def _fail(self, run: RunState, reason: str) -> None:
        log.info("workflow %s failed: %s", run.workflow_id, reason)
        self._release_object(run)
        self.runs.pop(run.workflow_id, None)
        # A user who cancelled meanwhile keeps their word: then nothing changes.
        self._ended(
            run.workflow_id,
            self.db.finish(Finish(run.workflow_id, WorkflowStatus.FAILED, error=reason)),
        )


def _plan(claimed: Claimed) -> RunState:
    """The in-memory run of a claimed workflow; ``OrchestratorError`` if it cannot run."""
    if claimed.steps is None:
        raise OrchestratorError(f"workflow definition {claimed.definition!r} is gone")
    # A definition stored before forks and joins were refused would run as a wrong chain.
    if problems := chain_problems(claimed.steps):
        raise OrchestratorError(
            f"workflow definition {claimed.definition!r} cannot run: {'; '.join(problems)}"
        )
    steps = []
    for step in _ordered(claimed.steps):
        spec = claimed.task_defs.get(step["task"])
        if spec is None:
            raise OrchestratorError(f"task {step['task']!r} of step {step['ref']!r} is gone")
        steps.append(
            StepSpec(
                step["ref"],
                step["task"],
                str(spec["module"]),
                float(spec["timeout_s"]),
                int(spec["retries"]),
                float(spec["retry_backoff_s"]),
                step.get("params") or {},
            )
        )
    given = claimed.input
    image = str(given.get("image") or "")
    data = given.get("data")
    return RunState(
        claimed.id,
        claimed.policy,
        claimed.data_plane if image else DataPlane.NONE,  # no image: nothing to move
        steps,
        image,
        data=data if isinstance(data, dict) else {},
        result_format=_format(given.get("result_format")),
        intermediate_format=_format(given.get("intermediate_format")),
        current_uri=image,
    )


def _format(given: Any) -> str:
    """A stored input's image format; the API admits only known ones, and one it no longer
    knows (a row written by a later version) falls back to lossless PNG."""
    name = str(given or "png")
    return name if name in imagebuf.RESULT_FORMATS else "png"


def _completion(run: RunState, result_uri: str | None) -> Finish:
    """COMPLETED, with every task's output merged (later tasks win) and kept per step."""
    output: dict[str, Any] = {}
    for ref_output in run.outputs.values():
        output.update(ref_output)
    output["tasks"] = run.outputs
    return Finish(run.workflow_id, WorkflowStatus.COMPLETED, output=output, result_uri=result_uri)


def _result_key(run: RunState) -> str:
    return f"results/{run.workflow_id}{imagebuf.RESULT_FORMATS[run.result_format].extension}"


def _ordered(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Steps in an order that respects ``depends_on`` (they run one after another)."""
    done: set[str] = set()
    ordered: list[dict[str, Any]] = []
    pending = list(steps)
    while pending:
        ready = [s for s in pending if set(s.get("depends_on") or []) <= done]
        if not ready:
            raise OrchestratorError("the workflow definition has a dependency cycle")
        for step in ready:
            ordered.append(step)
            done.add(step["ref"])
            pending.remove(step)
    return ordered
