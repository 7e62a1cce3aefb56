"""Objects a worker holds ahead of the step that reads them, and getting them back when the
worker's process ends.

A step whose outputs one step alone reads hands them to that step's worker as it ends, or
keeps them (a join's inputs: the join starts once its last input is made; along a chain, until
the next step is sent). The scheduler records that worker as their owner, with the worker's
``started_at`` that the instruction sending them there saw (``Obj.given``, ``stamp``). No task
of theirs is in flight there, so the recovery of a lost task does not look at them. When that
worker dies, or starts afresh under the same id, the minion's recovery rule returns what its
process held to the scheduler, their recovery container. Seeing another ``started_at`` (or the
worker dead), the scheduler asks the minion where each is (``regain``): back with it, the
object is the scheduler's again, and the step that reads it is placed like one reading an
object of the scheduler's (moved to that step's worker, wherever the inputs still held pin
it); still that worker's (handed on to its new process, or kept by a container the new process
took over), it is stamped anew; on another host, or on its way, it is asked about again at the
next look; gone, the caller drives the run again from its input.

It looks at every tick (``recovery``), when a step is placed (``Dispatcher.choose``: a new
process may beat between two ticks), and when a step fails at the worker it was given such an
input at (``reports``: placed before a heartbeat said that worker had restarted, it waited for
an object that never came; that attempt is lost, not the task's).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

import cdi
from cdi import ObjectKey
from orchestrator.scheduler.context import SchedulerContext
from orchestrator.scheduler.data import Mode, Obj
from orchestrator.scheduler.placement import WorkerLoad
from orchestrator.scheduler.runs import InFlight, RunState

__all__ = ["regain", "stale", "stamp"]

log = logging.getLogger(__name__)


def stamp(run: RunState, flight: InFlight, keys: Iterable[ObjectKey]) -> None:
    """Note, for each of ``keys`` (what a report's step made) that a worker now owns, the
    ``started_at`` of that worker when the step's instruction went out: its own worker's
    (kept) or its ``hand_to``'s (handed on)."""
    hand_to = flight.instruction.hand_to
    for key in keys:
        obj = run.objects.get(key)
        if obj is None:
            continue
        if obj.owner == flight.worker:
            obj.given = flight.worker_started
        elif hand_to and obj.owner == hand_to:
            obj.given = flight.hand_to_started


def stale(
    ctx: SchedulerContext,
    run: RunState,
    loads: Mapping[str, WorkerLoad],
    keys: Iterable[ObjectKey] | None = None,
) -> list[Obj]:
    """The objects of ``run`` (or those of ``keys``) a worker holds ahead of their step whose
    process is not the one they were given to: dead, gone or started again. One a step in
    flight reads as its own is that task's (``Recovery.check_in_flight``)."""
    objs = run.objects.values() if keys is None else (run.objects.get(k) for k in keys)
    held = [o for o in objs if o is not None and o.owner != ctx.id]
    if not held:
        return []
    reading = {k for s in run.out() for k, m in s.modes.items() if m is Mode.OWN}
    found = []
    for obj in held:
        load = loads.get(obj.owner)
        moved = load is None or not load.alive or load.started_at != obj.given
        if moved and obj.key not in reading:
            found.append(obj)
    return found


def regain(
    ctx: SchedulerContext, run: RunState, objs: list[Obj], loads: Mapping[str, WorkerLoad]
) -> list[Obj]:
    """Ask the minion (and the directory, for one not on our host) where each of ``objs`` is;
    take back those it returned to us, stamp anew those the worker's live process holds. The
    ones no host has, which the run must make again."""
    if not objs:
        return []
    here = {str(o.get("key", "")): str(o.get("owner", "")) for o in ctx.cdi.list_objects()}
    gone = []
    for obj in objs:
        worker, load = obj.owner, loads.get(obj.owner)
        owner = here.get(obj.key)
        if owner is None:
            try:
                found = ctx.cdi.whereabouts(obj.key)
            except cdi.CDIError:
                continue  # the directory is away: look again next time
            if found is None:
                if load is None or load.host in ("", ctx.cdi.host):
                    gone.append(obj)
                continue  # on another host the directory may not reach: look again
            owner = found[1]
        if owner == ctx.id:
            log.info("object %s of workflow %s came back from %s, which held it ahead of its "
                     "step", obj.key, run.workflow_id, worker)  # fmt: skip
            obj.owner, obj.given = ctx.id, 0.0
        elif owner == worker and load is not None and load.alive:
            obj.given = load.started_at
    return gone
