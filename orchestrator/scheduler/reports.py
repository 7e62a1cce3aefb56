"""What the scheduler does with a worker's report: follow the objects, start the steps it made
possible (or end the run), or retry a failed attempt.

A report and what follows from it are written in one statement (``SchedulerStore.report``):
the task run's outcome, the hand-backs of its objects, the task runs of the steps it lets start
(and of those it made skipped, or a switch it decided) or the run's end. The next steps'
instructions go out before that statement (*send, then record*, ``dispatch``).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from typing import Any, Final

import redis

import cdi
from orchestrator.contract.messages import Instruction, Report
from orchestrator.contract.vocabulary import DataPlane, TaskRunStatus
from orchestrator.db.run_statements import Finish, Handoff, Placement
from orchestrator.logs import log_context
from orchestrator.scheduler import progress
from orchestrator.scheduler.context import SchedulerContext
from orchestrator.scheduler.data import Datum, Mode, Obj
from orchestrator.scheduler.dispatch import Dispatcher
from orchestrator.scheduler.endings import Endings, completion, ended_rows
from orchestrator.scheduler.guarded import guarded
from orchestrator.scheduler.runs import Phase, RunState, StepRun
from workflows.binding import IMAGE
from workflows.kinds import Kind

__all__ = ["Reports"]

log = logging.getLogger(__name__)

# Attempts a step may lose with their workers (killed, restarted, gone silent) on top of its
# own ``retries``, which count only the task's failures. Bounded: a task that kills its worker
# every time (out of memory, a crash in native code) must still end its workflow.
MAX_LOST_ATTEMPTS: Final = 3
# A step whose attempts fail because S3 does not answer (``Report.outage``) is tried again,
# spending none of its ``retries``, for this long from the first such failure in a row, at
# growing intervals of at most ``OUTAGE_BACKOFF_MAX_S``: an S3 outage of a few minutes delays
# the workflow instead of failing it.
OUTAGE_PATIENCE_S: Final = 300.0
OUTAGE_BACKOFF_S: Final = 0.5
OUTAGE_BACKOFF_MAX_S: Final = 5.0


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
        # Drives a run again from its input (``Redrive.run``); the loop sets it.
        self.redrive: Callable[[RunState, str], None] | None = None

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
        if report.restarting:
            self.dispatch.restarting(report.worker_id)
        run = self.ctx.runs.get(uuid.UUID(report.workflow_id))
        step = run.flight(report.task_run_id) if run is not None else None
        if run is None or step is None or step.in_flight is None:
            log.info("stale report for task run %s", report.task_run_id)
            self.endings.drop_stale(report)
            return
        flight = step.in_flight
        ins = flight.instruction
        self.dispatch.returned(flight)
        step.in_flight = None
        completed = report.status == TaskRunStatus.COMPLETED
        back = self._hand_backs(run, report)
        moves = progress.Moves()
        lost, shared = False, list[str]()
        if run.data_plane != DataPlane.OBJECT_STORE:
            lost, shared = self._follow_objects(run, step, report, ins, completed)
        made: dict[str, Any] | None = None
        if completed and not lost:
            run_s = max(0.0, report.finished_at - report.started_at)
            self.dispatch.ran(step.current.task, run_s, report.bytes_out)
            data = self._made(run, step, report, ins)
            made = {"made": {n: d.describe() for n, d in data.items()}}
            results = dict(report.results)
            if run.data_plane == DataPlane.OBJECT_STORE and step.node.ref in run.graph.sinks:
                results[IMAGE] = ins.output_uri  # every step of this plane PUTs its image
            if results:
                made["results"] = results
                run.results.update({f"{step.id}.{n}": u for n, u in results.items()})
            progress.done(run, step, data, report.output, moves)
        for key in shared:  # after ``done``: a datum passed on unchanged reads it on
            progress.read_done(run, key, report.worker_id, moves)
        placements: list[Placement] = []
        finish: Finish | None = None
        if completed and not run.cancelled and not moves.failure:
            placements = self._place(run, moves)
            if run.finished:
                finish = completion(run, self.ctx.objects)
        rows = [*placements, *ended_rows(self.ctx.db, run, moves)]
        # One statement records the report and the next steps' task runs, or ends the run.
        ended = self.ctx.db.report(report, back, rows, finish, made)
        self.endings.free(run, moves.freed)
        if lost:
            self.after_lost_image(run, step)
        elif not completed and report.objects_gone and self.redrive is not None:
            # An object the scheduler handed out is gone: most likely the minion restarted
            # before the tick noticed. Not the task's fault: no attempt is spent on it.
            self.ctx.faults.minion = True  # the next tick asks the minion
            self.redrive(run, f"worker {report.worker_id}: {report.error}")
        elif not completed:
            self.after_failure(
                run, step, report.error or report.status, report.retryable, outage=report.outage
            )
        elif moves.failure:
            self.endings.fail(run, moves.failure)
        elif finish is not None:
            self.endings.completed(run, ended)
        elif run.cancelled:
            self.endings.quiet(run)

    def _place(self, run: RunState, moves: progress.Moves) -> list[Placement]:
        """Place what became ready and what the run's parallelism held back until now (this
        report brought one of its step runs back), in the run's order."""
        try:
            return self.dispatch.place(run)
        except (redis.RedisError, cdi.CDIError) as exc:  # the tick's sweep places them later
            log.warning("workflow %s: could not place %s now: %s", run.workflow_id,
                        ", ".join(s.id for s in moves.ready), exc)  # fmt: skip
            self.ctx.faults.minion |= isinstance(exc, cdi.MinionUnavailable)
            return []

    def after_failure(
        self,
        run: RunState,
        step: StepRun,
        reason: str,
        retryable: bool,
        *,
        lost: bool = False,
        outage: bool = False,
    ) -> None:
        """A failed attempt of ``step``: retry it after its backoff, or fail the run. A
        ``lost`` attempt (its worker died) spends none of the step's ``retries``, up to
        ``MAX_LOST_ATTEMPTS``; nor does an ``outage`` (S3 did not answer), for up to
        ``OUTAGE_PATIENCE_S``."""
        spec = step.current
        step.phase = Phase.READY
        now = time.monotonic()
        step.lost += lost
        step.outages += outage
        step.outage_since = (step.outage_since or now) if outage else 0.0
        own_failures = step.attempt - step.lost - step.outages
        if run.cancelled:
            self.endings.quiet(run)
        elif outage and now - step.outage_since <= OUTAGE_PATIENCE_S:
            backoff = OUTAGE_BACKOFF_S * 2 ** min(step.outages - 1, 8)
            self._retry(step, now + min(OUTAGE_BACKOFF_MAX_S, backoff))
        elif outage:
            self.endings.fail(
                run, f"task {step.id!r} failed after {step.attempt} attempt(s): S3 has not "
                f"answered for {OUTAGE_PATIENCE_S:g} s: {reason}",
            )  # fmt: skip
        elif retryable and own_failures <= spec.retries and step.lost <= MAX_LOST_ATTEMPTS:
            self._retry(step, now + spec.retry_backoff_s * 2 ** (own_failures + step.lost - 1))
        else:
            self.endings.fail(
                run, f"task {step.id!r} failed after {step.attempt} attempt(s): {reason}"
            )

    def _retry(self, step: StepRun, at: float) -> None:
        step.retry_at = at
        step.attempt += 1
        self._wake_at(step.retry_at)  # the tick dispatches it

    def after_lost_image(self, run: RunState, step: StepRun) -> None:
        """The image ``step`` read was lost with its worker's memory: the steps that made it
        run again from the object it was computed from (``progress.rewind``). Those attempts
        count as lost, not as the tasks' failures, so they spend none of the steps' ``retries``
        (up to ``MAX_LOST_ATTEMPTS``)."""
        if run.cancelled:
            self.endings.quiet(run)
            return
        for again in run.steps.values():
            if again.spec is None or again.phase is not Phase.WAITING:
                continue
            if again.lost > MAX_LOST_ATTEMPTS:
                self.endings.fail(run, f"task {again.id!r} lost its image with its worker's "
                                       f"memory {again.lost} times")  # fmt: skip
                return
            if again.attempt - again.lost - again.outages > again.spec.retries + 1:
                self.endings.fail(
                    run, f"task {again.id!r} lost its image with its worker's memory and has "
                    f"no retries left (attempt {again.attempt} of {again.spec.retries + 1})",
                )  # fmt: skip
                return
        moves = progress.settle(run)
        placed = self.dispatch.place(run, moves.ready)
        self.ctx.db.place([*placed, *ended_rows(self.ctx.db, run, moves)])

    # ------------------------------------------------------------------ objects
    def _hand_backs(self, run: RunState, report: Report) -> list[Handoff]:
        """The objects the report's worker handed back to us."""
        back = []
        keys = [report.key] if report.key and not report.kept else []
        keys += report.returned
        keys += _written_keys(report)  # named outputs always come back (``named_data``)
        for key in keys:
            obj = run.objects.get(key)
            nbytes = obj.nbytes if obj is not None else report.bytes_out
            back.append(Handoff(
                report.worker_id, self.ctx.id, nbytes, report.return_us,
                self.dispatch.host_of(report.worker_id), self.ctx.cdi.host,
                datum=obj.datum if obj is not None else "", mode="transfer",
            ))  # fmt: skip
        return back

    def _follow_objects(
        self, run: RunState, step: StepRun, report: Report, ins: Instruction, completed: bool
    ) -> tuple[bool, list[str]]:
        """Where each object the step read is now: ``(lost, shared)``. ``lost``: the image it
        read was only in its worker's memory and is gone (the run rewinds); ``shared``: the
        objects it read through shares, whose reads are done once its outputs are known."""
        worker = report.worker_id
        shared: list[str] = []
        for key, mode in step.modes.items():
            obj = run.objects.get(key)
            if obj is None:
                continue
            if mode is Mode.READ:
                # Reads of it by this worker still on the way besides this one.
                others = obj.readers.get(worker, 0) - 1
                if completed:
                    shared.append(key)  # this read ends in ``read_done``, below
                else:
                    obj.read_failed(worker)
                if key in report.released and others > 0:
                    self._share_again(obj, worker)
            elif key in report.returned or (key == report.key and not report.kept):
                obj.owner = self.ctx.id
            elif key == report.key:
                obj.owner = worker
            elif completed:
                run.objects.pop(key, None)  # the worker destroyed it after its task
        if not completed and ins.input_uri and report.key and report.key == ins.key:
            # The input it fetched came back: the retry reads it, fetching nothing.
            run.objects[ins.key] = Obj(ins.key, Kind.IMAGE, report.bytes_in, self.ctx.id,
                                       pending=1, datum=f"input.{IMAGE}")  # fmt: skip
            step.reads[IMAGE] = Datum(key=ins.key, kind=Kind.IMAGE)
        elif not completed and ins.held and report.key and report.key != ins.key:
            # Its held input, written into an object for the retry.
            old = run.objects.pop(ins.key, None)
            run.objects[report.key] = Obj(
                report.key, Kind.IMAGE, report.bytes_out or report.bytes_in, self.ctx.id,
                pending=1, datum=old.datum if old is not None else "",
            )  # fmt: skip
            step.reads[IMAGE] = Datum(key=report.key, kind=Kind.IMAGE)
        if ins.key and report.held_lost:
            obj = run.objects.get(ins.key)
            if obj is not None and obj.held:
                obj.owner = self.ctx.id if not report.kept else worker
                progress.rewind(run, obj, reader=step)
                return True, shared
        return False, shared

    def _share_again(self, obj: Obj, worker: str) -> None:
        """``worker`` gave up its share while another of its reads was on the way: share again
        (the read waits for it)."""
        try:
            self.ctx.cdi.use(obj.key, check=False).share([worker])
        except cdi.CDIError as exc:
            log.warning("could not share %s with %s again: %s", obj.key, worker, exc)

    def _made(
        self, run: RunState, step: StepRun, report: Report, ins: Instruction
    ) -> dict[str, Datum]:
        """The data ``step`` made, its objects registered in the run."""
        worker = report.worker_id
        owner = worker if report.kept else self.ctx.id
        made: dict[str, Datum] = {}
        if report.key and not report.stored:
            made[IMAGE] = self._image(run, step, report, owner, ins)
        elif IMAGE in step.reads and not report.key and not ins.output_key:
            made[IMAGE] = step.reads[IMAGE]  # read through a share, passed on unchanged
        for name, described in report.objects.items():
            made[name] = self._registered(run, step, name, described, self.ctx.id, worker)
        return made

    def _image(
        self, run: RunState, step: StepRun, report: Report, owner: str, ins: Instruction
    ) -> Datum:
        key = report.key
        obj = run.objects.get(key)
        if obj is None:
            obj = run.objects[key] = Obj(key, Kind.IMAGE, report.bytes_out or report.bytes_in,
                                         owner, made_by=report.worker_id)  # fmt: skip
        obj.owner, obj.pending, obj.datum = owner, 0, f"{step.id}.{IMAGE}"
        obj.nbytes = report.bytes_out or report.bytes_in or obj.nbytes
        if report.held:
            read = step.reads.get(IMAGE)
            if obj.held and ins.held:
                obj.held_chain = (*obj.held_chain, step.id)
            else:
                producer = _producer(run, read)
                obj.held_chain, obj.held_base = (step.id,), producer
            obj.held = str(report.task_run_id)
        else:
            obj.held, obj.held_chain, obj.held_base = "", (), ("", "")
        return Datum(key=key, kind=Kind.IMAGE)

    def _registered(
        self, run: RunState, step: StepRun, name: str, described: Any, owner: str, worker: str
    ) -> Datum:
        if isinstance(described, dict) and "items" in described:
            items = described["items"]
            return Datum(items=tuple(
                self._registered(run, step, f"{name}.{i}", d, owner, worker)
                for i, d in enumerate(items)
            ))  # fmt: skip
        key, kind = str(described["key"]), Kind(described["kind"])
        run.objects[key] = Obj(key, kind, int(described.get("nbytes", 0)), owner,
                               datum=f"{step.id}.{name}", made_by=worker)  # fmt: skip
        return Datum(key=key, kind=kind)


def _written_keys(report: Report) -> list[str]:
    keys: list[str] = []

    def walk(described: Any) -> None:
        if isinstance(described, dict) and "items" in described:
            for item in described["items"]:
                walk(item)
        elif isinstance(described, dict) and "key" in described:
            keys.append(str(described["key"]))

    for described in report.objects.values():
        walk(described)
    return keys


def _producer(run: RunState, read: Datum | None) -> tuple[str, str]:
    """Which step run made ``read`` and under which name (``input``: the run's input)."""
    if read is None or read.uri:
        return ("input", IMAGE)
    for step_id, data in run.made.items():
        for name, datum in data.items():
            if datum.key == read.key:
                return (step_id, name)
    return ("input", IMAGE)
