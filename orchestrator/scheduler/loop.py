"""The scheduler: turns wake-ups and worker reports into placements (paper section V-D).

One thread runs the loop and is the only one writing this scheduler's task runs to Postgres.
Each turn takes the workers' reports waiting and a wake-up (``Reports.take``, one round trip;
with none, it waits on Redis for either until the next tick is due), hands them to the
collaborators whose job they are, and then does what that made possible. A turn's writes go
to Postgres in one transaction, the runs it ended with the rest, committed durably at its end
(``SchedulerStore.end_turn``; a turn that ended runs commits before the tick's housekeeping if
that is due); only then is what the turn decided seen outside the scheduler: ends announced,
objects destroyed, the reports read trimmed (``context.Turn``). Its collaborators:

* ``claims.Claims``: which workflows to run (claimed, or resumed after a restart);
* ``dispatch.Dispatcher``: where a run's step goes, and sending it there;
* ``reports.Reports``: what a report means for its run (the next step, the end, a retry);
* ``recovery.Recovery``: tasks lost with their workers, and a Redis that lost its data;
* ``endings.Endings``: completion, failure, cancellation and time-outs (a run past its
  ``timeout_s``: the tick comes at its deadline), and freeing a run's object;
* ``redrive.Redrive``: a run the scheduler can no longer trust (a step raised, the minion
  restarted, Postgres failed a statement) driven again from its input;
* ``orphans.OrphanObjects``: objects of our workflows that no run names any more;
* ``schedules.Schedules``: the runs of schedules' due ticks.

Whatever raises in a step leaves no workflow stuck (``guarded`` notes what failed; the tick
acts on it). The scheduler's liveness lock and the lease of the reconciler live in Postgres
(``db.scheduler_liveness``): as lease holder, a scheduler takes over the RUNNING workflows of
schedulers that died; every tick it stamps ``keys.SCHEDULERS`` for ``/api/readyz``.

They share the runs in memory (``runs``: ``RunState`` by workflow id) and the database
through ``db.scheduler_store``. The scheduler touches no image: the first task's worker
fetches the input from S3, and the last task's worker stores the result.

Ownership of a workflow's CDI object: the first task's worker creates it from the input, with
the scheduler as its recovery container, and the scheduler transfers it to the worker of each
later task that runs elsewhere. Under ``affinity`` the worker keeps it until the last task;
otherwise it hands it back with its report. A worker that dies hands it back too, by the
minion's recovery rule, so a retry always starts from an intact object (or, if it died while
making it, from the input in S3 again). Under ``affinity`` the worker may also hold a task's
new image in memory instead of writing it (``Instruction.hold``); if that image is lost, the
run goes back to the first step whose image was held and recomputes it from the object
(``RunState.follow_held``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from typing import Final

import psycopg
import redis

from orchestrator.contract import keys, read_wake
from orchestrator.contract.alive import AliveStamp
from orchestrator.db.schedule_store import ScheduleStore
from orchestrator.db.scheduler_liveness import SchedulerLiveness
from orchestrator.db.scheduler_store import SchedulerStore
from orchestrator.errors import ServiceError
from orchestrator.objectstore import ObjectStore
from orchestrator.scheduler.claims import Claims
from orchestrator.scheduler.context import SchedulerContext
from orchestrator.scheduler.dispatch import Dispatcher
from orchestrator.scheduler.endings import Endings
from orchestrator.scheduler.guarded import guarded
from orchestrator.scheduler.minion_link import MinionLink
from orchestrator.scheduler.object_directory import ObjectDirectory
from orchestrator.scheduler.orphans import OrphanObjects
from orchestrator.scheduler.planes import uses_objects
from orchestrator.scheduler.recovery import Recovery
from orchestrator.scheduler.redrive import Redrive
from orchestrator.scheduler.reports import Reports
from orchestrator.scheduler.runs import RunState
from orchestrator.scheduler.schedules import Schedules
from orchestrator.settings import Settings

__all__ = ["REDIS_RETRY_S", "TICK_S", "Scheduler", "connect_redis"]

log = logging.getLogger(__name__)

# Housekeeping: claims a wake-up missed, lost workers, a Redis that lost its data, runs waiting
# for room. *Why 1 s, not less:* each tick costs a claim statement and Redis round trips even
# when nothing happens, and ticks are most of an idle scheduler's CPU; new workflows
# and reports wake the loop at once, and a retry that falls due brings the tick forward.
TICK_S: Final = 1.0
_MIN_WAIT_S: Final = 0.01  # Redis reads a blocking timeout of 0 as "forever"
REDIS_RETRY_S: Final = 0.5  # after a Redis connection error, the loop waits this long
RECONCILE_S: Final = 5.0  # how often to reconcile with Postgres and look for left objects


def connect_redis(url: str) -> redis.Redis:
    """The loop's Redis client: one connection, as the loop thread is its only user. *Why:*
    redis-py's pool takes a connection and gives it back around every command (redis-py 8.1),
    CPU the scheduler spends on every workflow. Unlike a pooled one, a lone connection that
    Redis dropped fails its next command (and then reconnects): the loop takes that as a
    Redis error and goes on."""
    return redis.Redis.from_url(url, decode_responses=True, single_connection_client=True)


class Scheduler:
    """One scheduler's loop and its collaborators."""

    def __init__(
        self,
        scheduler_id: str,
        settings: Settings,
        db: SchedulerStore,
        redis_client: redis.Redis,
        cdi_client: MinionLink,
        objects: ObjectStore,
        *,
        liveness: SchedulerLiveness | None = None,
        directory: ObjectDirectory | None = None,
    ) -> None:
        self.ctx = ctx = SchedulerContext(scheduler_id, db, redis_client, cdi_client, objects)
        self.id, self.db, self.redis, self.runs = ctx.id, ctx.db, ctx.redis, ctx.runs
        self.reply_key = ctx.reply_key
        self.liveness = liveness
        # Each collaborator is given those it calls; none calls back up this list.
        self.dispatch = Dispatcher(ctx)
        self.endings = Endings(ctx, self.dispatch)
        self.claims = Claims(ctx, settings, self.dispatch, self.endings)
        self.redrive = Redrive(ctx, self.dispatch, self.endings, self.claims)
        self.reports = Reports(ctx, self.dispatch, self.endings, self.redrive)
        self.recovery = Recovery(ctx, self.dispatch, self.reports, self.redrive)
        self.orphans = OrphanObjects(ctx, self.endings, directory or ObjectDirectory(cdi_client))
        self.schedules = Schedules(ScheduleStore(db), self.claims, ctx.tick)
        self._stopping = False
        self._alive = AliveStamp.from_env()  # what the supervisor watches: the loop turns
        self._reconcile_at = 0.0  # monotonic
        ctx.turn.commit = self._commit_now

    def run_forever(self) -> None:
        log.info("scheduler %s started", self.id)
        self.start_up()
        while not self._stopping:
            self.step()
        self.db.close()
        if self.liveness is not None:
            self.liveness.close()
        with contextlib.suppress(redis.RedisError):
            self.redis.hdel(keys.SCHEDULERS, self.id)  # gone on purpose, not stalled
        log.info("scheduler %s stopped", self.id)

    def start_up(self) -> None:
        """Take the liveness lock, record the reports our previous process took and had not
        committed (``Reports.read_again``), then resume our RUNNING workflows; while Postgres
        or Redis does not answer, wait for it (a stack may be restarting it right now)."""
        while not self._stopping:
            self._alive.renew()
            self._begin_turn()
            done = False
            try:
                if self.liveness is not None:
                    self.liveness.start()
                self.reports.read_again()
                self.claims.resume("the scheduler restarted")
                self.claims.check_limits()
                done = True
            except (psycopg.OperationalError, ServiceError, redis.RedisError) as exc:
                log.warning("Postgres or Redis does not answer yet (%s); trying again", exc)
            # A start-up whose writes were lost leaves the first tick to resync.
            if self._end_turn(commit=done) and done:
                return
            time.sleep(REDIS_RETRY_S)

    def stop(self) -> None:
        self._stopping = True

    def step(self) -> None:
        """One turn of the loop: the reports waiting and a wake-up (waiting for one until the
        next tick is due), then whatever they made possible; its writes committed at its end,
        and then what waited for that commit."""
        self._begin_turn()
        try:
            self._turn()
        except BaseException:
            # What escapes the guarded steps ends the process: nothing of the turn is seen
            # outside (its reports stay taken, for the next process to read again).
            self._abandon_turn()
            raise
        self._end_turn(commit=True)

    def _begin_turn(self) -> None:
        self.db.begin_turn()
        self.ctx.turn.begin()

    def _end_turn(self, *, commit: bool) -> bool:
        """Commit the turn's writes, then run what waited for that; whether they were
        committed. Writes lost (a statement failed, the commit failed) leave memory ahead of
        Postgres: the tick resyncs with it."""
        faults = self.ctx.faults
        try:
            committed = self.db.end_turn(commit=commit)
        except ServiceError as exc:
            log.warning("Postgres failed the turn's commit (%s); resuming from what it has", exc)
            committed = False
        if not committed:
            faults.postgres = True
        self.ctx.turn.end(committed, faults)
        return committed

    def _commit_now(self) -> None:
        """Commit the turn so far and let it be seen, then go on in a new transaction."""
        self._end_turn(commit=True)
        self._begin_turn()

    def _abandon_turn(self) -> None:
        with contextlib.suppress(Exception):
            self.db.end_turn(commit=False)
        self.ctx.turn.drop()

    def _take(self) -> tuple[list[str], str | None]:
        """The reports waiting and a wake-up; with neither, wait for one until the tick is
        due. *Why the bell:* a blocking pop takes a report out of Redis before it is recorded;
        the wait is on the report list's bell and the wake-up list, and reports only move."""
        tick = self.ctx.tick
        try:
            taken, wake = self.reports.take(wake=True)
            if taken or wake is not None:
                return taken, wake
            wait_s = max(_MIN_WAIT_S, tick.at - time.monotonic())
            bell = keys.report_bell_key(self.reply_key)
            popped = self.redis.brpop([bell, keys.WAKE], timeout=wait_s)
            if popped is None:
                return [], None
            if str(popped[0]) == keys.WAKE:
                return [], str(popped[1])
            return self.reports.take(wake=False)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            # Redis restarted or dropped our connection: the next command reconnects. What
            # it lost is noticed by the tick's epoch check; what a wake-up missed, by its claim.
            log.warning(
                "Redis failed the loop's read (%s); trying again in %g s", exc, REDIS_RETRY_S
            )
            time.sleep(REDIS_RETRY_S)
            return [], None

    def _turn(self) -> None:
        tick = self.ctx.tick
        taken, wake = self._take()
        if taken:
            self.reports.read_all(taken)
        if wake is not None:
            # Its claim writes to Postgres: a failure there must not end the loop.
            guarded(functools.partial(self._on_wake, wake), self.ctx.faults)
        if (taken or wake is not None) and self.dispatch.waiting:
            self.dispatch.dispatch_waiting()  # a report may have freed a slot
        if self.claims.due():
            guarded(self.claims.claim, self.ctx.faults)  # runs ended: take the next ones waiting
        if time.monotonic() >= tick.at:
            self.ctx.turn.commit_if_told()  # the ends told so far do not wait for the tick
            tick.at = time.monotonic() + TICK_S
            self._tick()
        self._redrive_unsent()
        if self.dispatch.waits_to_note:
            guarded(self.dispatch.note_waits, self.ctx.faults)

    def _on_wake(self, value: str) -> None:
        wake = read_wake(value)
        if wake.schedules:
            self.schedules.changed()
            self.ctx.tick.by(time.monotonic())
            return
        run = None if wake.workflow_id is None else self.runs.get(wake.workflow_id)
        if run is None:
            if not wake.pause:  # a paused PENDING run is not claimed; a resumed one is woken
                self.claims.claim()  # a new or retried run (a cancelled PENDING one is not)
        elif wake.cancel:
            self.endings.check_cancelled(run)
        elif wake.pause:
            self._check_paused([run])
        # else: a new run that an earlier claim already took, with others, in one batch

    def _check_paused(self, runs: list[RunState]) -> None:
        """Follow what Postgres says of ``runs`` being paused: a resumed one goes on."""
        paused = self.db.paused_among([r.workflow_id for r in runs])
        for run in runs:
            was, run.paused = run.paused, run.workflow_id in paused
            if was and not run.paused and not run.cancelled:
                log.info("workflow %s resumed", run.workflow_id)
                self.dispatch.dispatch(run)

    def _tick(self) -> None:
        self._alive.renew()
        faults = self.ctx.faults
        if faults.postgres:
            guarded(self.redrive.resync, faults)
            if faults.postgres:
                return  # Postgres is still away: nothing else can be recorded
        guarded(self._check_minion, faults)
        guarded(self._beat, faults)
        guarded(self.endings.flush_outbox, faults)
        guarded(self.endings.retry_destroys, faults)
        guarded(self.recovery.check_redis_epoch, faults)
        guarded(self.schedules.tick, faults)
        guarded(self.claims.claim, faults)
        guarded(self.recovery.check_in_flight, faults)
        now = time.monotonic()
        for run in list(self.runs.values()):
            if run.deadline is not None and run.deadline <= now and not run.cancelled:
                guarded(functools.partial(self.endings.time_out, run), faults)
                continue
            due = [s for s in run.steps.values() if s.retry_at and s.retry_at <= now]
            for step in due:
                step.retry_at = 0.0
            if due:
                guarded(functools.partial(self.dispatch.dispatch, run), faults)
        self.dispatch.dispatch_waiting()
        guarded(lambda: self.dispatch.limits.renew(self.dispatch.leases()), faults)
        for run, reason in self.dispatch.unrunnable():
            guarded(functools.partial(self.endings.fail, run, reason), faults)
        self.redrive.sweep()
        if now >= self._reconcile_at:
            self._reconcile_at = now + RECONCILE_S
            guarded(self._reconcile, faults)
            guarded(self.orphans.sweep, faults)

    def _beat(self) -> None:
        """Say that the loop turns (``/api/readyz`` reads it)."""
        self.redis.hset(keys.SCHEDULERS, self.id, f"{time.time():.3f}")

    def _check_minion(self) -> None:
        """While any run keeps an object in the minion (or a call found it gone), ask whether
        the minion is still the one we know; if it restarted, its objects are gone."""
        faults = self.ctx.faults
        if not faults.minion and not any(uses_objects(r) for r in self.runs.values()):
            return
        restarted = self.ctx.cdi.check()
        faults.minion = False
        if restarted:
            self.redrive.minion_restarted()

    def _reconcile(self) -> None:
        """Take over what dead schedulers left (as lease holder), and resume our RUNNING
        workflows that no run in memory stands for (taken over, or a write of ours lost)."""
        if self.liveness is not None and self.liveness.tick(self.claims.room()):
            self.claims.resume("its scheduler stopped")
        self.claims.resume("it was RUNNING with nothing under way")
        self.claims.check_limits()
        self._check_paused(list(self.runs.values()))  # a pause's wake-up may have been lost

    def _redrive_unsent(self) -> None:
        """Drive again each run whose instruction Redis did not take after objects had gone
        to its worker (``Dispatcher.take_unsent``), unless it has ended or been driven again."""
        for run, reason in self.dispatch.take_unsent():
            if self.runs.get(run.workflow_id) is run:
                guarded(functools.partial(self.redrive.run, run, reason), self.ctx.faults)
