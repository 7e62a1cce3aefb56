"""Placing a run's current step: pick the worker, move the object there, send the instruction,
record the task run.

The worker is chosen from live loads (``placement.choose_worker``): heartbeats, re-read at
most every ``BEATS_TTL_S`` (workers beat every 2 s, so reading them per placement only cost
round trips), plus this scheduler's own count of instructions out at each worker, which is
always current. A step goes only to a worker that loaded its task's module
(``placement.capable``). A step that may go to any worker but finds none with room waits here
(``waiting``, oldest first) until a report frees a slot (late binding, ``placement``); one
that no live worker can run waits too, and ``unrunnable`` names it once it has waited
``UNRUNNABLE_AFTER_S`` (the loop then fails its run).

*Send, then record:* an instruction is pushed before its task run is recorded, so the record
overlaps the worker's run; its report waits in the scheduler's list until the loop thread,
the one recording, reads it. An instruction Redis does not take goes to ``unsent`` (the loop
places the run again, ``redrive.Redrive.unsent``); a worker gone from the minion when its
object is moved there is avoided and the step placed elsewhere.
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
from typing import Final

import redis

import cdi
from orchestrator.contract import keys
from orchestrator.contract.vocabulary import DataPlane
from orchestrator.db.run_statements import Handoff, Placement
from orchestrator.logs import log_context
from orchestrator.scheduler.context import SchedulerContext
from orchestrator.scheduler.guarded import guarded
from orchestrator.scheduler.instructions import instruction_for
from orchestrator.scheduler.placement import (
    Link,
    Route,
    WorkerLoad,
    capable,
    choose_worker,
    read_workers,
)
from orchestrator.scheduler.runs import InFlight, RunState, StepSpec

__all__ = ["BEATS_TTL_S", "LOST_GRACE_S", "UNRUNNABLE_AFTER_S", "Dispatcher"]

BEATS_TTL_S: Final = 0.5  # heartbeats are re-read at most this often (workers beat every 2 s)
# A step no live worker can run (none loaded its module) fails its run after this long: time
# for a worker being restarted with the code to come back, but no run stuck for good.
UNRUNNABLE_AFTER_S = 30.0
LOST_GRACE_S: Final = 5.0  # beyond a task's timeout before its silent worker is presumed gone
_FIRST_GUESS_S: Final = 0.05  # a task's expected run time before one has been measured
_GONE_RETRY_S: Final = 0.2  # a step whose worker vanished at the hand-off is placed again after

log = logging.getLogger(__name__)

# What to do with a run whose instruction Redis did not take: (run, worker, whether its object
# had been moved to that worker, the error).
Unsent = Callable[[RunState, str, bool, Exception], None]


class Dispatcher:
    """Sends runs' steps to workers and keeps what placement needs to know about them."""

    def __init__(self, ctx: SchedulerContext) -> None:
        self.ctx = ctx
        # Runs whose current step waits for a worker (none alive, or none with room), oldest
        # first.
        self.waiting: dict[uuid.UUID, RunState] = {}
        self.task_s: dict[str, float] = defaultdict(lambda: _FIRST_GUESS_S)  # EWMA per task
        self._in_flight: dict[str, int] = defaultdict(int)  # instructions out, per worker
        self._rng = random.Random()
        self._beats: dict[str, dict[str, str]] = {}
        self._beats_read = -math.inf  # monotonic time of the last heartbeat read
        self._loads: dict[str, WorkerLoad] = {}  # as the latest choice saw them
        self.link = Link.from_env()  # what crossing to another host costs; learnt as it goes
        self.unsent: Unsent | None = None  # set by the loop (redrive)

    # ------------------------------------------------------------------ placing
    def dispatch(self, run: RunState) -> None:
        """Place the run's current step now, or leave it waiting for a worker with room."""
        if run.cancelled or run.workflow_id not in self.ctx.runs:
            return
        with log_context(workflow_id=str(run.workflow_id), step=run.current.ref):
            placement = self.choose(run)
            if placement is not None and self.send(run, placement):
                self.ctx.db.place(placement)

    def unrunnable(self) -> list[tuple[RunState, str]]:
        """The waiting runs whose step no live worker has been able to run for longer than
        ``UNRUNNABLE_AFTER_S`` (some worker lives, none loaded the module), each with why;
        they no longer wait."""
        now = time.monotonic()
        stuck = []
        for run in list(self.waiting.values()):
            since = run.unrunnable_since
            if since and now - since > UNRUNNABLE_AFTER_S and not run.cancelled:
                self.waiting.pop(run.workflow_id, None)
                stuck.append((run, _unrunnable(run.current)))
        return stuck

    def dispatch_waiting(self) -> None:
        """Place waiting runs, oldest first, while workers have room. A sweep tries one run per
        (task, policy, previous worker): the others like it would be refused the same way."""
        refused: set[tuple[str, str, str | None]] = set()
        for run in list(self.waiting.values()):
            if run.cancelled or self.ctx.runs.get(run.workflow_id) is not run:
                self.waiting.pop(run.workflow_id, None)
                continue
            like = (run.current.task, run.policy, run.last_worker)
            if like in refused:
                continue
            guarded(functools.partial(self.dispatch, run), self.ctx.faults)
            if run.workflow_id in self.waiting:
                refused.add(like)

    def choose(self, run: RunState) -> Placement | None:
        """Choose the worker for the current step and move the object to it: the task run to
        record; ``None`` while no worker may take it (the run then waits)."""
        step = run.current
        loads = self.loads()
        able = capable(loads, step.module)
        if not any(w.alive for w in able) and any(w.alive for w in loads):
            run.unrunnable_since = run.unrunnable_since or time.monotonic()
        else:
            run.unrunnable_since = 0.0
        worker = choose_worker(
            able,
            run.policy,
            run.last_worker,
            task_s=self.task_s[step.task],
            nbytes=run.nbytes,
            rng=self._rng,
            avoid=run.avoid,
            route=self._route(run, loads),
        )
        if worker is None:
            self.waiting.setdefault(run.workflow_id, run)
            return None
        self.waiting.pop(run.workflow_id, None)
        self._loads = {w.worker_id: w for w in loads}
        handoff = None
        if run.data_plane == DataPlane.CDI and run.key and run.owner != worker:
            try:
                took_us = self._transfer(run, worker)
            except cdi.UnknownContainer:
                # It died after its last heartbeat (on this host or another, whose gateway
                # says so): the object is still ours; go elsewhere.
                log.warning("worker %s is gone from the minion; placing %s elsewhere",
                            worker, run.workflow_id)  # fmt: skip
                run.avoid = run.avoid | {worker}
                run.retry_at = time.monotonic() + _GONE_RETRY_S
                return None
            handoff = Handoff(
                self.ctx.id, worker, run.nbytes, took_us, self.ctx.cdi.host,
                self.host_of(worker),
            )  # fmt: skip
        return Placement(
            self.ctx.db.next_task_run_id(),
            run.workflow_id,
            step.ref,
            step.task,
            run.attempt,
            worker,
            time.time(),
            handoff,
        )

    def send(self, run: RunState, placement: Placement) -> bool:
        """Push the instruction for ``placement`` (before its task run is recorded) and note
        it as the run's task in flight; False (the run handed to ``unsent``) when Redis did
        not take it."""
        step, worker = run.current, placement.worker
        instruction = instruction_for(
            run,
            placement.task_run_id,
            placement.queued_at,
            scheduler_id=self.ctx.id,
            reply_to=self.ctx.reply_key,
            objects=self.ctx.objects,
            runs_next=self._runs_next(run, worker),
        )
        load = self._loads.get(worker)
        run.in_flight = InFlight(
            instruction,
            worker,
            worker_started=load.started_at if load is not None else 0.0,
            deadline=time.monotonic() + step.timeout_s + LOST_GRACE_S,
        )
        run.attempts[step.ref] = run.attempt  # a recomputed step's attempts go on from here
        run.last_worker = worker
        self._in_flight[worker] += 1
        try:
            self.ctx.redis.lpush(keys.worker_queue_key(worker), instruction.dumps())
        except redis.RedisError as exc:
            if self.unsent is None:
                raise
            self.unsent(run, worker, placement.handoff is not None, exc)
            return False
        return True

    def _runs_next(self, run: RunState, worker: str) -> bool:
        """Whether ``worker`` loaded the module of the step after the current one."""
        if run.last_step:
            return False
        load = self._loads.get(worker)
        return load is not None and bool(capable([load], run.steps[run.step + 1].module))

    def _transfer(self, run: RunState, worker: str) -> float:
        started = time.perf_counter_ns()
        self.ctx.cdi.use(run.key, check=False).transfer(worker)
        run.owner = worker
        took_us = (time.perf_counter_ns() - started) / 1000
        load = self._loads.get(worker)
        if load is not None and load.host and load.host != self.ctx.cdi.host:
            self.link.observe(run.nbytes, took_us / 1e6)  # it crossed: learn the link
        return took_us

    def host_of(self, worker: str) -> str:
        """The CDI host of ``worker`` as its latest heartbeat said ("" if unknown)."""
        load = self._loads.get(worker)
        return load.host if load is not None else ""

    def _route(self, run: RunState, loads: list[WorkerLoad]) -> Route:
        """Where the run's object is, for pricing a move to another host. A run with no CDI
        object yet (dataless, object-store, or a first task, whose worker makes it) moves
        nothing: no route, and no CDI call."""
        if run.data_plane != DataPlane.CDI or not run.key or not run.owner:
            return Route()
        hub = self.ctx.cdi.host
        if not run.owner or run.owner == self.ctx.id:
            return Route(hub, hub, self.link)
        holder = next((w for w in loads if w.worker_id == run.owner), None)
        return Route(holder.host if holder is not None else hub, hub, self.link)

    # ------------------------------------------------------------------ what comes back
    def returned(self, flight: InFlight) -> None:
        """A task out at a worker was reported, or given up as lost."""
        self._in_flight[flight.worker] -= 1

    def ran(self, task: str, run_s: float) -> None:
        """A task of ``task`` took ``run_s``: the running mean late binding plans with."""
        self.task_s[task] = 0.8 * self.task_s[task] + 0.2 * run_s

    def loads(self) -> list[WorkerLoad]:
        """Live worker loads: the latest heartbeats and this scheduler's in-flight counts."""
        now = time.monotonic()
        if now - self._beats_read >= BEATS_TTL_S:
            ids = sorted(str(i) for i in self.ctx.redis.smembers(keys.WORKERS))
            pipe = self.ctx.redis.pipeline(transaction=False)
            for worker_id in ids:
                pipe.hgetall(keys.worker_key(worker_id))
            self._beats = {
                w: {str(k): str(v) for k, v in h.items()}
                for w, h in zip(ids, pipe.execute(), strict=True)
                if h
            }
            self._beats_read = now
        return read_workers(self._beats, self._in_flight, keys.WORKER_DEAD_AFTER_S)


def _unrunnable(step: StepSpec) -> str:
    module = step.module.partition(":")[0]
    return (
        f"no live worker has loaded module {module!r} for task {step.task!r} (step "
        f"{step.ref!r}) in {UNRUNNABLE_AFTER_S:g} s; start workers with the task code "
        "(cdiflow up --tasks PATH, or cdiflow worker --tasks PATH) and retry the run"
    )
