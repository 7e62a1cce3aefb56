"""Placing step runs: pick the worker, move the objects they read there, send the
instruction, record the task run.

A run's ready step runs go out at once, as many as workers have room for and the run's
parallelism allows (``RunState.max_parallel``): each is placed by its run's policy
(``policies``: a choice from the step, where its data is and the live workers), from
heartbeats re-read at most every ``BEATS_TTL_S`` plus this scheduler's own count of
instructions out at each worker, which is always current. A step goes only to a worker that
loaded its task's module (``placement.capable``). One that may go to any worker but finds
none with room waits here (``waiting``, oldest first) until a report frees a slot (late
binding); one that no live worker can run waits too, and ``unrunnable`` names it once it has
waited ``UNRUNNABLE_AFTER_S``, or its definition's ``worker_wait_s`` (the loop then fails its
run). While no live worker can run a step, its run says what it waits for (its
``status_detail`` and a ``task.waiting`` event), written by ``note_waits`` once the loop has
recorded what led there, so the events keep their order.

*The objects it reads* go to the chosen worker before the instruction does
(``object_moves.ObjectMover``): the last read of an object takes it, a read while others are
to come gets a read-only share, a worker on another host its own copy.

*Send, then record:* an instruction is pushed before its task run is recorded, so the record
overlaps the worker's run; its report waits in the scheduler's list until the loop thread, the
one recording, reads it. While the loop reads a turn's reports, their next steps' instructions
are held and pushed together, one pipeline, still before they are recorded (``hold``). An
instruction Redis does not take is placed again soon; if objects had already gone to that
worker, its run is left to the loop to drive again (``take_unsent``). A worker gone from the
minion when an object is moved there is avoided and the step placed elsewhere.
"""

from __future__ import annotations

import functools
import logging
import math
import random
import time
import uuid
from collections import defaultdict
from typing import Final

import redis

import cdi
from orchestrator.contract import keys
from orchestrator.db.run_statements import Placement
from orchestrator.logs import log_context
from orchestrator.scheduler import ahead
from orchestrator.scheduler.context import SchedulerContext
from orchestrator.scheduler.guarded import guarded
from orchestrator.scheduler.instructions import chain_keeps, sole_reader
from orchestrator.scheduler.join_binding import bound_worker
from orchestrator.scheduler.limits import TaskLimits
from orchestrator.scheduler.object_moves import ObjectMover
from orchestrator.scheduler.placement import Link, Route, WorkerLoad, capable, read_workers
from orchestrator.scheduler.planes import plane_of
from orchestrator.scheduler.policies import (
    Choice,
    NextStep,
    PlacementPolicy,
    pinned,
    policy_of,
)
from orchestrator.scheduler.runs import InFlight, Phase, RunState, StepRun, StepSpec

__all__ = ["BEATS_TTL_S", "LOST_GRACE_S", "UNRUNNABLE_AFTER_S", "Dispatcher"]

BEATS_TTL_S: Final = 0.5  # heartbeats are re-read at most this often (workers beat every 2 s)
# A step no live worker can run (none loaded its module) fails its run after this long: time
# for a worker being restarted with the code to come back, but no run stuck for good.
UNRUNNABLE_AFTER_S = 30.0
LOST_GRACE_S: Final = 5.0  # beyond a task's timeout before its silent worker is presumed gone
_FIRST_GUESS_S: Final = 0.05  # a task's expected run time before one has been measured
_GONE_RETRY_S: Final = 0.2  # a step whose worker vanished at the hand-off is placed again after
_UNSENT_RETRY_S: Final = 0.5  # a step whose instruction Redis did not take is placed again after

log = logging.getLogger(__name__)

Waiting = tuple[RunState, StepRun]


class Dispatcher:
    """Sends runs' steps to workers and keeps what placement needs to know about them."""

    def __init__(self, ctx: SchedulerContext) -> None:
        self.ctx = ctx
        # Step runs that wait for a worker (none alive, or none with room) or for a place under
        # their task's concurrency limit; placed highest priority first, oldest first within
        # a priority (``_queue``: the order each came in).
        self.waiting: dict[tuple[uuid.UUID, str], Waiting] = {}
        self._queue: dict[tuple[uuid.UUID, str], int] = {}
        self._came = 0
        self.limits = TaskLimits(ctx.redis)
        self.task_s: dict[str, float] = defaultdict(lambda: _FIRST_GUESS_S)  # EWMA per task
        self.made_bytes: dict[str, int] = {}  # EWMA per task of the image it makes
        self._in_flight: dict[str, int] = defaultdict(int)  # instructions out, per worker
        self._reported_at: dict[str, float] = {}  # unix time of each worker's latest report
        self._rng = random.Random()
        self._beats: dict[str, dict[str, str]] = {}
        self._beats_read = -math.inf  # monotonic time of the last heartbeat read
        self._loads: dict[str, WorkerLoad] = {}  # as the latest choice saw them
        self.link = Link.from_env()  # what crossing to another host costs; learnt as it goes
        self.mover = ObjectMover(ctx, self.link, self.load_of)
        # Runs to drive again, with why: an instruction Redis did not take after objects had
        # gone to its worker (the loop drives them, ``take_unsent``).
        self._unsent: list[tuple[RunState, str]] = []
        # Workers starting afresh, with the ``started_at`` of the process that is ending.
        self._restarting: dict[str, float] = {}
        # Streaming groups that need more slots at once than the live workers have: (run,
        # steps, slots, since when), by (run, the group's first step).
        self._too_few_slots: dict[tuple[uuid.UUID, str], tuple[RunState, int, int, float]] = {}
        # What runs wait for, to write: (run, status detail or None, event kind, its data).
        self._waits: list[tuple[RunState, str | None, str, dict[str, str]]] = []
        # Instructions ``send`` holds while a loop turn reads its reports (``hold``), to go
        # out together (``send_held``); the task runs of those Redis did not take.
        self._held: list[tuple[RunState, StepRun, Placement, bytes]] | None = None
        self._unrecorded: set[int] = set()

    # ------------------------------------------------------------------ placing
    def dispatch(self, run: RunState) -> None:
        """Place the run's ready step runs now (those no worker has room for wait)."""
        placed = self.place(run)
        if placed:
            self.ctx.db.place(placed)

    def place(self, run: RunState, steps: list[StepRun] | None = None) -> list[Placement]:
        """Choose, move and send each of ``steps`` (default: every ready one) while the run's
        parallelism allows; the task runs to record."""
        if run.cancelled or run.paused or run.workflow_id not in self.ctx.runs:
            return []
        now = time.monotonic()
        ready = steps if steps is not None else list(run.steps.values())
        placed = []
        outranked = self._outranked(run)
        grouped: set[str] = set()
        for step in ready:
            if step.phase is not Phase.READY or step.retry_at > now:
                continue
            group = run.graph.stream_groups.get(step.node.ref)
            if group is not None:  # a streaming group goes out whole, or waits whole
                if step.id not in grouped:
                    grouped.update(group)
                    sent, ok = self._place_group(run, group, now)
                    placed += sent
                    if not ok:
                        break
                continue
            if run.busy >= run.max_parallel:
                break  # the rest go out as these come back
            if outranked and (run.workflow_id, step.id) not in self.waiting:
                self._wait(run, step)  # behind runs of a higher priority: in their order
                continue
            with log_context(workflow_id=str(run.workflow_id), step=step.id):
                placement = self.choose(run, step)
                if placement is None:
                    continue
                if not self.send(run, step, placement):
                    break  # Redis failed: the rest would fail too (the step goes again soon)
                placed.append(placement)
        return placed

    def _place_group(
        self, run: RunState, group: tuple[str, ...], now: float
    ) -> tuple[list[Placement], bool]:
        """Place every step of a streaming group, each on a free worker slot (its steps run
        at the same time and wait for each other, so none may queue behind another task), or
        none: they wait until enough slots are free. Not before every one of them is ready;
        above the run's parallelism if need be. The placements, and False if Redis failed."""
        members = [run.steps.get(ref) for ref in group]
        steps = [m for m in members if m is not None]
        if len(steps) < len(members) or any(
            m.phase is not Phase.READY or m.retry_at > now for m in steps
        ):
            return [], True  # placed once the last of them is ready
        loads = self.loads()
        free = {
            w.worker_id: w.slots - w.in_flight
            for w in loads
            if w.alive and w.worker_id not in self._restarting
        }
        ident = (run.workflow_id, group[0])
        slots = sum(w.slots for w in loads if w.alive)
        if 0 < slots < len(steps):
            # It cannot start until workers with enough slots live: it fails its run once that
            # lasted as long as a step may wait for a worker.
            self._too_few_slots.setdefault(ident, (run, len(steps), slots, time.monotonic()))
            for waiting in steps:
                self._wait(run, waiting)
            return [], True
        self._too_few_slots.pop(ident, None)
        chosen: list[tuple[StepRun, str]] = []
        for step in steps:
            able = capable(loads, step.current.module)
            self._note_wait(run, step, loads, able)
            options = [w for w in able if free.get(w.worker_id, 0) > 0]
            if not options:
                for waiting in steps:
                    self._wait(run, waiting)
                return [], True
            best = max(options, key=lambda w: (free[w.worker_id], -w.score()))
            free[best.worker_id] -= 1
            chosen.append((step, best.worker_id))
        placed: list[Placement] = []
        for step, worker in chosen:
            with log_context(workflow_id=str(run.workflow_id), step=step.id):
                placement = self.choose(run, step, worker=worker)
                if placement is None:
                    continue  # its worker just went: it goes again, and its peers fail alone
                if not self.send(run, step, placement):
                    return placed, False
                placed.append(placement)
        return placed, True

    def unrunnable(self) -> list[tuple[RunState, str]]:
        """The waiting runs whose step no live worker could run for longer than they may wait,
        each with why; they no longer wait. How long: the definition's ``worker_wait_s``;
        without one, ``UNRUNNABLE_AFTER_S`` once some worker lives but none loaded the module,
        and for as long as no worker lives at all. A streaming group that needs more slots at
        once than the live workers have in all fails its run after as long."""
        now = time.monotonic()
        stuck = []
        for group, (run, steps, slots, since) in list(self._too_few_slots.items()):
            patience = run.worker_wait_s if run.worker_wait_s is not None else UNRUNNABLE_AFTER_S
            ended = run.cancelled or self.ctx.runs.get(run.workflow_id) is not run
            if ended or now - since > patience:
                del self._too_few_slots[group]
                for ref in list(run.steps):
                    self._unwait((run.workflow_id, ref))
                if not ended:
                    stuck.append((run, (
                        f"streaming step {group[1]!r} and the {steps - 1} joined to it by "
                        f"channels run at once, each on a worker slot, but the live workers have "
                        f"{slots} slot(s) in all (waited {patience:g} s); start more workers, or "
                        "workers with more slots (cdiflow worker --concurrency)"
                    )))  # fmt: skip
        for ident, (run, step) in list(self.waiting.items()):
            if run.cancelled:
                continue
            limit, since = run.worker_wait_s, step.waiting_since
            if limit is not None and since and now - since > limit:
                why = (
                    f"step {step.id!r} waited longer than the definition's worker_wait_s "
                    f"({limit:g} s) for a worker able to run it: {step.waiting_for}"
                )
            elif limit is None and step.unrunnable_since:
                if now - step.unrunnable_since <= UNRUNNABLE_AFTER_S:
                    continue
                why = _unrunnable(step.current)
            else:
                continue
            self._unwait(ident)
            stuck.append((run, why))
        return stuck

    def _outranked(self, run: RunState) -> bool:
        """Whether a step of a run of a higher priority waits: ``run``'s steps then wait too,
        so that a report's next steps do not overtake it."""
        return any(other.priority > run.priority for other, _ in self.waiting.values())

    def _wait(self, run: RunState, step: StepRun) -> None:
        ident = (run.workflow_id, step.id)
        if ident not in self.waiting:
            self.waiting[ident] = (run, step)
            self._came += 1
            self._queue[ident] = self._came

    def _unwait(self, ident: tuple[uuid.UUID, str]) -> None:
        self.waiting.pop(ident, None)
        self._queue.pop(ident, None)

    def _in_order(self) -> list[tuple[tuple[uuid.UUID, str], Waiting]]:
        """The waiting step runs, highest priority first, then in the order they came."""
        queue = self._queue
        return sorted(
            self.waiting.items(), key=lambda item: (-item[1][0].priority, queue.get(item[0], 0))
        )

    def dispatch_waiting(self) -> None:
        """Place waiting step runs, highest priority first and oldest first within one, while
        workers have room. A sweep tries one per (task, policy, previous worker): the others
        like it would be refused the same way."""
        refused: set[tuple[str, str, str | None]] = set()
        for ident, (run, step) in self._in_order():
            if run.cancelled or self.ctx.runs.get(run.workflow_id) is not run:
                self._unwait(ident)
                continue
            if step.phase is not Phase.READY:
                self._unwait(ident)
                continue
            if run.paused:
                continue  # stays in line until the run is resumed
            like = (step.current.task, run.policy, step.last_worker)
            if like in refused:
                continue
            guarded(functools.partial(self._place_one, run, step), self.ctx.faults)
            if ident in self.waiting:
                refused.add(like)

    def _place_one(self, run: RunState, step: StepRun) -> None:
        placed = self.place(run, [step])
        if placed:
            self.ctx.db.place(placed)

    def choose(self, run: RunState, step: StepRun, worker: str | None = None) -> Placement | None:
        """Choose the worker for ``step`` (``worker``: that one, chosen already) and move its
        objects there: the task run to record; ``None`` while no worker may take it (it then
        waits)."""
        spec = step.current
        loads = self.loads()
        able = capable(loads, spec.module)
        self._note_wait(run, step, loads, able)
        able = [w for w in able if w.worker_id not in self._restarting]
        self._regain_ahead(run, step, loads)
        nbytes, near = self._where(run, step)
        choice = Choice(
            able,
            self.task_s[spec.task],
            nbytes,
            near=near,
            home=run.home,
            chain=run.graph.is_chain,
            avoid=step.avoid,
            route=self._route(run, near, loads),
            rng=self._rng,
        )
        kept_by = self._kept_by(run, step)
        policy = policy_of(run)
        if worker is None:
            # A worker kept an object this step reads (``keeps``): the step runs only there.
            worker = pinned(choice, kept_by) if kept_by is not None else policy.choose(choice)
        ident = (run.workflow_id, step.id)
        if worker is None:
            self._wait(run, step)
            return None
        lease = self._lease(run, step)
        if lease is None:
            self._wait(run, step)  # every place under its task's limit is taken
            return None
        self._unwait(ident)
        step.lease = lease
        self._loads = {w.worker_id: w for w in loads}
        try:
            moves = self.mover.move(run, step, worker)
        except cdi.UnknownContainer:
            # It died after its last heartbeat (on this host or another, whose gateway says
            # so): what was not moved is still ours; go elsewhere.
            log.warning("worker %s is gone from the minion; placing %s of %s elsewhere",
                        worker, step.id, run.workflow_id)  # fmt: skip
            self._give_back(spec, step.lease)
            step.lease = ""
            step.avoid = step.avoid | {worker}
            step.retry_at = time.monotonic() + _GONE_RETRY_S
            return None
        policy.placed(run, worker)
        return Placement(
            self.ctx.db.next_task_run_id(),
            run.workflow_id,
            step.id,
            spec.task,
            step.attempt,
            worker,
            time.time(),
            tuple(moves),
            data={"reads": {n: d.describe() for n, d in step.reads.items()}},
        )

    def _regain_ahead(self, run: RunState, step: StepRun, loads: list[WorkerLoad]) -> None:
        """Take back what ``step`` reads from a worker that held it ahead of the step and
        has started again or died since (``ahead``), before it pins the step there. One gone
        is the tick's to act on."""
        by_id = {w.worker_id: w for w in loads}
        keys = [k for d in step.reads.values() for k in d.object_keys()]
        ahead.regain(self.ctx, run, ahead.stale(self.ctx, run, by_id, keys), by_id)

    def _lease(self, run: RunState, step: StepRun) -> str | None:
        """A place under the step's task's concurrency limit ("" for a task without one);
        None while every place is taken."""
        spec = step.current
        if spec.max_concurrency <= 0:
            return ""
        member = f"{run.workflow_id}/{step.id}/{step.attempt}"
        return member if self.limits.acquire(spec.task, spec.max_concurrency, member) else None

    def _give_back(self, spec: StepSpec, lease: str) -> None:
        if lease:
            self.limits.release(spec.task, lease)

    def leases(self) -> list[tuple[str, str]]:
        """Every (task, lease) this scheduler holds: its steps out under a limit."""
        return [
            (step.in_flight.lease_task, step.in_flight.lease)
            for run in self.ctx.runs.values()
            for step in run.out()
            if step.in_flight is not None and step.in_flight.lease
        ]

    def _note_wait(
        self, run: RunState, step: StepRun, loads: list[WorkerLoad], able: list[WorkerLoad]
    ) -> None:
        """Whether a live worker (or one starting afresh) could run ``step``; if none can, the
        run says what it waits for (its status detail and a ``task.waiting`` event), and once
        one can, that it waits no more (``task.unblocked``)."""
        now = time.monotonic()
        if any(w.alive or w.worker_id in self._restarting for w in able):
            step.unrunnable_since = step.waiting_since = 0.0
            if step.waiting_for:
                step.waiting_for = ""
                others = [s for s in run.steps.values() if s.waiting_for]
                detail = others[0].waiting_for if others else None
                self._waits.append((run, detail, "task.unblocked", {"ref": step.id}))
            return
        alive = sorted(w.worker_id for w in loads if w.alive)
        step.unrunnable_since = (step.unrunnable_since or now) if alive else 0.0
        step.waiting_since = step.waiting_since or now
        detail = _waiting_for(step, alive)
        if detail != step.waiting_for:
            step.waiting_for = detail
            module = step.current.module.partition(":")[0]
            data = {"ref": step.id, "task": step.current.task, "module": module, "reason": detail}
            self._waits.append((run, detail, "task.waiting", data))

    @property
    def waits_to_note(self) -> bool:
        return bool(self._waits)

    def note_waits(self) -> None:
        """Write what runs wait for, as ``choose`` found it (the loop calls this once it has
        recorded the reports that led there)."""
        while self._waits:
            run, detail, kind, data = self._waits[0]
            if not run.cancelled:
                self.ctx.db.waiting(run.workflow_id, detail, kind, data)
            self._waits.pop(0)

    def restarting(self, worker: str) -> None:
        """``worker`` ends the process it runs in (a task that would not stop) and starts
        afresh: place nothing there until its new process beats (a new ``started_at``)."""
        beat = self._beats.get(worker, {})
        try:
            self._restarting[worker] = float(beat.get("started_at", "0"))
        except ValueError:
            self._restarting[worker] = 0.0
        self._beats_read = -math.inf

    def _where(self, run: RunState, step: StepRun) -> tuple[int, str | None]:
        """The bytes of the objects ``step`` reads, and the worker that has the largest."""
        nbytes, near, largest = 0, None, -1
        for datum in step.reads.values():
            for key in datum.object_keys():
                obj = run.objects.get(key)
                if obj is None:
                    continue
                nbytes += obj.nbytes
                if obj.nbytes > largest:
                    largest = obj.nbytes
                    near = obj.owner if obj.owner != self.ctx.id else obj.made_by
        return nbytes, near

    def send(self, run: RunState, step: StepRun, placement: Placement) -> bool:
        """Push the instruction for ``placement`` (before its task run is recorded) and note
        it as the step's task in flight; False when Redis did not take it (``_unsent``)."""
        spec, worker = step.current, placement.worker
        assert worker is not None
        keep, hand_to = self._next_holder(run, step, worker)
        instruction = plane_of(run).instruction(
            self.ctx,
            run,
            step,
            placement.task_run_id,
            placement.queued_at,
            keep=keep,
            hand_to=hand_to,
        )
        load, next_load = self._loads.get(worker), self._loads.get(hand_to)
        step.in_flight = InFlight(
            instruction,
            worker,
            worker_started=load.started_at if load is not None else 0.0,
            deadline=time.monotonic() + spec.timeout_s + LOST_GRACE_S,
            lease=step.lease,
            lease_task=spec.task if step.lease else "",
            hand_to_started=next_load.started_at if next_load is not None else 0.0,
        )
        step.lease = ""
        step.phase = Phase.OUT
        run.attempts[step.id] = step.attempt  # a recomputed step's attempts go on from here
        step.last_worker = worker
        self._in_flight[worker] += 1
        if self._held is not None:
            self._held.append((run, step, placement, instruction.dumps()))
            return True
        try:
            self.ctx.redis.lpush(keys.worker_queue_key(worker), instruction.dumps())
        except redis.RedisError as exc:
            self._unsent_one(run, step, worker, bool(placement.handoffs), exc)
            return False
        return True

    def hold(self) -> None:
        """From now on ``send`` holds the instructions, to push them in one round trip
        (``send_held``, ``release``). The caller sends them before their task runs are
        recorded and before any other message to their workers (*send, then record*)."""
        if self._held is None:
            self._held = []

    def release(self) -> None:
        """Push the instructions held and hold no more."""
        self.send_held()
        self._held = None

    def send_held(self) -> None:
        """Push the instructions held (one LPUSH a worker, in one pipeline), in the order they
        were sent. Those Redis did not take are placed again soon (``_unsent_one``), their
        task runs not to be recorded (``unrecorded``)."""
        held = self._held
        if not held:
            return
        self._held = []
        by_worker: dict[str, list[bytes]] = defaultdict(list)
        for _, _, placement, text in held:
            by_worker[str(placement.worker)].append(text)
        pipe = self.ctx.redis.pipeline(transaction=False)
        for worker, texts in by_worker.items():
            pipe.lpush(keys.worker_queue_key(worker), *texts)  # the first pushed is popped first
        try:
            pipe.execute()
        except redis.RedisError as exc:
            for run, step, placement, _ in held:
                self._unsent_one(run, step, str(placement.worker), bool(placement.handoffs), exc)
                self._unrecorded.add(placement.task_run_id)

    def unrecorded(self) -> set[int]:
        """Push the instructions held (``send_held``); the task runs of those Redis did not
        take since the last call, which are not to be recorded."""
        self.send_held()
        unrecorded, self._unrecorded = self._unrecorded, set()
        return unrecorded

    def _unsent_one(
        self, run: RunState, step: StepRun, worker: str, moved: bool, exc: Exception
    ) -> None:
        """Redis did not take ``step``'s instruction for ``worker``: nothing is out, and the
        step goes again soon. If objects had already gone to that worker, the run is to be
        driven again (the worker is asked to give them back): the loop does it."""
        flight = step.in_flight
        if flight is not None:
            self.returned(flight)
            step.in_flight = None
        step.phase = Phase.READY
        step.retry_at = time.monotonic() + _UNSENT_RETRY_S
        reason = f"Redis failed the instruction for {worker} ({exc})"
        if moved:
            self._unsent.append((run, reason))
        else:
            log.warning("workflow %s: %s; placing it again", run.workflow_id, reason)

    def take_unsent(self) -> list[tuple[RunState, str]]:
        """The runs to drive again since the last call, each with why (``_unsent_one``)."""
        unsent, self._unsent = self._unsent, []
        return unsent

    def _next_holder(self, run: RunState, step: StepRun, worker: str) -> tuple[bool, str]:
        """Where what ``step`` makes goes when its task is done, the next step then pinned
        there: kept by ``worker`` (True), handed on to another worker (its id), or, when
        neither (False, ""), back to the scheduler. The run's policy's call
        (``PlacementPolicy.keeps``, ``hands_on``); a hand-on to ``worker`` itself is a keep."""
        policy, ahead = policy_of(run), _Ahead(self, run, step, worker)
        if policy.keeps(ahead):
            return True, ""
        hand_to = policy.hands_on(ahead) or ""
        return (True, "") if hand_to == worker else (False, hand_to)

    def _kept_by(self, run: RunState, step: StepRun) -> str | None:
        """The worker that kept an object ``step`` reads (the scheduler owns every other
        object between steps): ``step`` can run only there."""
        for datum in step.reads.values():
            for key in datum.object_keys():
                obj = run.objects.get(key)
                if obj is not None and obj.owner != self.ctx.id:
                    return obj.owner
        return None

    def runs_next(self, run: RunState, step: StepRun, worker: str) -> bool:
        """Whether ``worker`` loaded the module of every step that reads what ``step`` makes."""
        load = self._loads.get(worker)
        if load is None:
            return False
        readers = self.readers(run, step)
        return all(capable([load], run.specs[r].module) for r in readers if r in run.specs)

    @staticmethod
    def readers(run: RunState, step: StepRun) -> set[str]:
        """The steps that read what ``step`` makes."""
        return {r for name in run.graph.read_outputs(step.node.ref)
                for r in run.graph.readers(step.node.ref, name)}  # fmt: skip

    def host_of(self, worker: str) -> str:
        """The CDI host of ``worker`` as its latest heartbeat said ("" if unknown)."""
        return self.mover.host_of(worker)

    def load_of(self, worker: str) -> WorkerLoad | None:
        """``worker``'s load as the latest choice saw it."""
        return self._loads.get(worker)

    def _route(self, run: RunState, near: str | None, loads: list[WorkerLoad]) -> Route:
        """Where the step's largest object is, for pricing a move to another host. A run
        with no CDI object (dataless, object-store, or before its input is fetched) moves
        nothing: no route."""
        if not run.objects:
            return Route()
        hub = self.ctx.cdi.host
        holder = next((w for w in loads if w.worker_id == near), None)
        return Route(holder.host if holder is not None else hub, hub, self.link)

    # ------------------------------------------------------------------ what comes back
    def returned(self, flight: InFlight) -> None:
        """A task out at a worker was reported, withdrawn, or given up as lost: its worker has
        room again, and its place under its task's limit is free."""
        self._in_flight[flight.worker] -= 1
        self._reported_at[flight.worker] = time.time()
        if flight.lease:
            self.limits.release(flight.lease_task, flight.lease)

    def ran(self, task: str, run_s: float, made_bytes: int = 0) -> None:
        """A task of ``task`` took ``run_s`` and made an image of ``made_bytes``: the running
        means late binding and ``auto``'s keep plan with (a first task's object is the decoded
        input, far larger than the object it reads: none)."""
        self.task_s[task] = 0.8 * self.task_s[task] + 0.2 * run_s
        if made_bytes > 0:
            before = self.made_bytes.get(task, made_bytes)
            self.made_bytes[task] = int(0.8 * before + 0.2 * made_bytes)

    def loads(self) -> list[WorkerLoad]:
        """Live worker loads: the latest heartbeats and this scheduler's in-flight counts."""
        now = time.monotonic()
        if now - self._beats_read >= BEATS_TTL_S or self._restarting:
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
        loads = read_workers(
            self._beats, self._in_flight, keys.WORKER_DEAD_AFTER_S, reported_at=self._reported_at
        )
        if self._restarting:
            # A worker starting afresh is back once its new process beats, or gone.
            beating = {w.worker_id: w.started_at for w in loads if w.alive}
            for worker, old in list(self._restarting.items()):
                if beating.get(worker, old) != old or worker not in beating:
                    del self._restarting[worker]
        return loads


class _Ahead:
    """The step after one being sent, as the dispatcher tells its run's policy
    (``policies.Ahead``): worked out only when the policy asks."""

    def __init__(self, dispatch: Dispatcher, run: RunState, step: StepRun, worker: str) -> None:
        self._dispatch, self._run, self._step, self._worker = dispatch, run, step, worker

    def may_keep(self) -> bool:
        run, step = self._run, self._step
        if not plane_of(run).may_keep or not chain_keeps(run, step):
            return False
        return self._dispatch.runs_next(run, step, self._worker)

    def may_hand_on(self) -> bool:
        run, step = self._run, self._step
        if not plane_of(run).may_keep:
            return False
        return chain_keeps(run, step) or sole_reader(run, step) is not None

    def next_worker(self, policy: PlacementPolicy) -> str | None:
        dispatch, run, step = self._dispatch, self._run, self._step
        here = dispatch.load_of(self._worker)
        after = [run.specs[r] for r in dispatch.readers(run, step) if r in run.specs]
        if here is None or len(after) != 1:
            return None
        reader = sole_reader(run, step)
        bound = bound_worker(dispatch.ctx.id, run, reader) if reader is not None else None
        if bound is not None:
            return bound  # a join: where the steps before it sent already hand what they make
        able = [w for w in capable(list(dispatch._loads.values()), after[0].module)
                if w.worker_id not in dispatch._restarting]  # fmt: skip
        made = dispatch.made_bytes.get(step.current.task, 0)
        choice = Choice(
            able,
            dispatch.task_s[after[0].task],
            max(dispatch._where(run, step)[0], made),
            near=self._worker,
            home=run.home,
            chain=run.graph.is_chain,
            # Handed on straight from this worker's host: no way through the scheduler's.
            route=Route(here.host, here.host, dispatch.link),
            rng=dispatch._rng,
        )
        chosen = policy.choose(choice)
        if chosen is None:  # no worker has room now: it queues at the least loaded
            least = choice.best(room=False)
            chosen = least.worker_id if least is not None else None
        return chosen

    def next_step(self) -> NextStep | None:
        dispatch, run, step = self._dispatch, self._run, self._step
        here = dispatch.load_of(self._worker)
        after = [run.specs[r] for r in dispatch.readers(run, step) if r in run.specs]
        if here is None or len(after) != 1:
            return None
        loads = list(dispatch._loads.values())
        others = [w for w in capable(loads, after[0].module)
                  if w.alive and w.worker_id != self._worker]  # fmt: skip
        made = dispatch.made_bytes.get(step.current.task, 0)
        nbytes = max(dispatch._where(run, step)[0], made)
        route = Route(here.host, here.host, dispatch.link)  # handed on straight, if it moves
        return NextStep(here, others, dispatch.task_s[after[0].task], nbytes, route)


def _waiting_for(step: StepRun, alive: list[str]) -> str:
    """What a step no live worker can run waits for, and what would end the wait."""
    module = step.current.module.partition(":")[0]
    head = f"waiting for a worker that loads {module!r} to run step {step.id!r}"
    if not alive:
        return f"{head}: no worker is alive; start one (cdiflow up --workers N, or cdiflow worker)"
    return (
        f"{head}: the live workers ({', '.join(alive)}) have not loaded it; start workers "
        "with that task code (cdiflow up --tasks PATH, or cdiflow worker --tasks PATH)"
    )


def _unrunnable(step: StepSpec) -> str:
    module = step.module.partition(":")[0]
    return (
        f"no live worker has loaded module {module!r} for task {step.task!r} (step "
        f"{step.ref!r}) in {UNRUNNABLE_AFTER_S:g} s; start workers with the task code "
        "(cdiflow up --tasks PATH, or cdiflow worker --tasks PATH) and retry the run"
    )
