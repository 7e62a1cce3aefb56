"""Moving the objects a step run reads to the worker chosen for it, each hand-off recorded.

The last read of an object, with nobody reading it now, takes it — transferred to the worker,
as along a chain; a read while others are to come gets a read-only share, the scheduler
keeping the object; a worker on another host, which a share cannot reach, gets its own copy.
Each move is a ``Handoff`` to record beside the task run; a move that crossed to another host
teaches the ``Link`` what crossing costs.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import cdi
from cdi import ObjectKey
from orchestrator.db.run_statements import Handoff
from orchestrator.scheduler.context import SchedulerContext
from orchestrator.scheduler.data import Datum, Mode, Obj
from orchestrator.scheduler.placement import Link, WorkerLoad
from orchestrator.scheduler.runs import RunState, StepRun

__all__ = ["ObjectMover"]


class ObjectMover:
    """Transfers, shares or copies the objects a step run reads to its worker."""

    def __init__(
        self,
        ctx: SchedulerContext,
        link: Link,
        load_of: Callable[[str], WorkerLoad | None],
    ) -> None:
        self.ctx = ctx
        self.link = link  # learns from every move that crosses to another host
        self._load_of = load_of  # a worker's load as the latest placement saw it

    def move(self, run: RunState, step: StepRun, worker: str) -> list[Handoff]:
        """Move every object ``step`` reads to ``worker``: the last read takes the object,
        others get a share (a copy across hosts). Records each read's mode on the step run."""
        moves: list[Handoff] = []
        step.modes = {}
        for name, datum in list(step.reads.items()):
            step.reads[name] = self._moved(run, step, datum, worker, moves)
        return moves

    def host_of(self, worker: str) -> str:
        """The CDI host of ``worker`` as its latest heartbeat said ("" if unknown)."""
        load = self._load_of(worker)
        return load.host if load is not None else ""

    def _moved(
        self, run: RunState, step: StepRun, datum: Datum, worker: str, moves: list[Handoff]
    ) -> Datum:
        if datum.items is not None:
            items = tuple(self._moved(run, step, d, worker, moves) for d in datum.items)
            return Datum(items=items)
        obj = run.objects.get(datum.key) if datum.key else None
        if obj is None or datum.key in step.modes:
            return datum
        mode = obj.mode_for()
        started = time.perf_counter_ns()
        if mode is Mode.OWN:
            if obj.owner != worker:  # else the worker that made it kept it for this step
                self.ctx.cdi.use(obj.key, check=False).transfer(worker)
                moves.append(self._handoff(obj.owner, worker, obj, started, "transfer"))
                obj.owner, obj.given = worker, self._started(worker)
            step.modes[obj.key] = Mode.OWN
            return datum
        try:
            self.ctx.cdi.use(obj.key, check=False).share([worker])
        except cdi.UnknownContainer:
            load = self._load_of(worker)
            if load is None or load.host == self.ctx.cdi.host:
                raise  # gone, not elsewhere
            return self._copied(run, step, obj.key, worker, moves, started)
        obj.readers[worker] = obj.readers.get(worker, 0) + 1
        moves.append(self._handoff(self.ctx.id, worker, obj, started, "share"))
        step.modes[obj.key] = Mode.READ
        return datum

    def _copied(
        self,
        run: RunState,
        step: StepRun,
        key: ObjectKey,
        worker: str,
        moves: list[Handoff],
        started: int,
    ) -> Datum:
        """A reader on another host: its own copy of ``key``, handed over (a share reaches
        only containers of the object's own minion)."""
        obj = run.objects[key]
        copied = self.ctx.cdi.use(key, check=False).copy(f"{run.next_object_key()}.copy")
        copied.transfer(worker)
        run.objects[copied.key] = Obj(copied.key, obj.kind, obj.nbytes, worker, pending=1,
                                    datum=obj.datum, given=self._started(worker))  # fmt: skip
        obj.pending -= 1  # this read reads the copy
        moves.append(self._handoff(self.ctx.id, worker, obj, started, "copy"))
        step.modes[copied.key] = Mode.OWN
        return Datum(key=copied.key, kind=obj.kind)

    def _started(self, worker: str) -> float:
        load = self._load_of(worker)
        return load.started_at if load is not None else 0.0

    def _handoff(self, src: str, dst: str, obj: Obj, started: int, mode: str) -> Handoff:
        took_us = (time.perf_counter_ns() - started) / 1000
        src_host = self.ctx.cdi.host if src == self.ctx.id else self.host_of(src)
        dst_host = self.host_of(dst)
        if dst_host and dst_host != src_host and mode != "share":
            self.link.observe(obj.nbytes, took_us / 1e6)  # it crossed: learn the link
        return Handoff(
            src, dst, obj.nbytes, took_us, src_host, dst_host, datum=obj.datum, mode=mode
        )
