"""A report's objects, as the ``cdi`` (and ``none``) plane takes them in: where each object the
step read is now (``follow``), and the objects it made, registered in the run (``made_by``).

An object the worker handed back is the scheduler's again; one it kept (``Report.kept``)
stays its; one it handed on to the next step's worker (``Report.handed_to``) is that one's
(the image and the named outputs it made alike, but for those among ``Report.returned``);
one it owned and destroyed after its task is gone; a share it gave up while another read of
it by the same worker was still on its way is shared again. A step that failed leaves what the
retry reads: the input it fetched, or the image it held, written into an object. An image that
was only in the worker's memory (``Report.held_lost``) makes the run rewind to the step that
made it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import cdi
from cdi import ObjectKey
from orchestrator.contract.messages import Instruction, Report
from orchestrator.contract.vocabulary import TaskRunStatus
from orchestrator.scheduler import progress
from orchestrator.scheduler.context import SchedulerContext
from orchestrator.scheduler.data import Datum, Mode, Obj
from orchestrator.scheduler.planes.base import Received
from orchestrator.scheduler.runs import RunState, StepRun
from workflows.binding import IMAGE
from workflows.kinds import Kind

__all__ = ["follow", "holder", "made_by"]

log = logging.getLogger(__name__)


def follow(
    ctx: SchedulerContext, run: RunState, step: StepRun, report: Report, sent: Instruction
) -> Received:
    """Where each object the step read is now: ``lost`` when the image it read was only in
    its worker's memory and is gone (the run rewinds); ``shared``, the objects it read through
    shares, whose reads end once its outputs are known."""
    completed = report.status == TaskRunStatus.COMPLETED
    worker = report.worker_id
    got = Received()
    for key, mode in step.modes.items():
        obj = run.objects.get(key)
        if obj is None:
            continue
        if mode is Mode.READ:
            # Reads of it by this worker still on the way besides this one.
            others = obj.readers.get(worker, 0) - 1
            if completed:
                got.shared.append(key)  # this read ends in ``read_done``, once outputs are known
            else:
                obj.read_failed(worker)
            if key in report.released and others > 0:
                _share_again(ctx, obj, worker)
        elif key in report.returned:
            obj.owner = ctx.id
        elif key == report.key:
            obj.owner = holder(ctx, report)
        elif completed:
            run.objects.pop(key, None)  # the worker destroyed it after its task
    if not completed and sent.input_uri and report.key and report.key == sent.key:
        # The input it fetched came back: the retry reads it, fetching nothing.
        run.objects[sent.key] = Obj(sent.key, Kind.IMAGE, report.bytes_in, ctx.id,
                                    pending=1, datum=f"input.{IMAGE}")  # fmt: skip
        step.reads[IMAGE] = Datum(key=sent.key, kind=Kind.IMAGE)
    elif not completed and sent.held and report.key and report.key != sent.key:
        # Its held input, written into an object for the retry.
        old = run.objects.pop(sent.key, None)
        run.objects[report.key] = Obj(
            report.key, Kind.IMAGE, report.bytes_out or report.bytes_in, ctx.id,
            pending=1, datum=old.datum if old is not None else "",
        )  # fmt: skip
        step.reads[IMAGE] = Datum(key=report.key, kind=Kind.IMAGE)
    if sent.key and report.held_lost:
        obj = run.objects.get(sent.key)
        if obj is not None and obj.held:
            obj.owner = holder(ctx, report)
            progress.rewind(run, obj, reader=step)
            got.lost = True
    return got


def holder(ctx: SchedulerContext, report: Report, key: ObjectKey | None = None) -> str:
    """Who owns an object the step made now (default: the report's ``key``): the worker that
    kept it, the worker it handed it on to, or the scheduler (one that did not stay or go on
    with the rest is among ``returned``)."""
    if (key or report.key) in report.returned:
        return ctx.id
    if report.kept:
        return report.worker_id
    return report.handed_to or ctx.id


def _share_again(ctx: SchedulerContext, obj: Obj, worker: str) -> None:
    """``worker`` gave up its share while another of its reads was on the way: share again
    (the read waits for it)."""
    try:
        ctx.cdi.use(obj.key, check=False).share([worker])
    except cdi.CDIError as exc:
        log.warning("could not share %s with %s again: %s", obj.key, worker, exc)


def made_by(
    ctx: SchedulerContext, run: RunState, step: StepRun, report: Report, sent: Instruction
) -> dict[str, Datum]:
    """The data ``step`` made, its objects registered in the run."""
    worker = report.worker_id
    owner = holder(ctx, report)
    made: dict[str, Datum] = {}
    if report.key and not report.stored:
        made[IMAGE] = _image(run, step, report, owner, sent)
    elif IMAGE in step.reads and not report.key and not sent.output_key:
        made[IMAGE] = step.reads[IMAGE]  # read through a share, passed on unchanged
    for name, described in report.objects.items():
        made[name] = _registered(run, step, name, described, lambda k: holder(ctx, report, k),
                                 worker)  # fmt: skip
    return made


def _image(run: RunState, step: StepRun, report: Report, owner: str, sent: Instruction) -> Datum:
    key = report.key
    obj = run.objects.get(key)
    if obj is None:
        obj = run.objects[key] = Obj(key, Kind.IMAGE, report.bytes_out or report.bytes_in,
                                     owner, made_by=report.worker_id)  # fmt: skip
    obj.owner, obj.pending, obj.datum = owner, 0, f"{step.id}.{IMAGE}"
    obj.nbytes = report.bytes_out or report.bytes_in or obj.nbytes
    if report.held:
        read = step.reads.get(IMAGE)
        if obj.held and sent.held:
            obj.held_chain = (*obj.held_chain, step.id)
        else:
            producer = _producer(run, read)
            obj.held_chain, obj.held_base = (step.id,), producer
        obj.held = str(report.task_run_id)
    else:
        obj.held, obj.held_chain, obj.held_base = "", (), ("", "")
    return Datum(key=key, kind=Kind.IMAGE)


def _registered(
    run: RunState,
    step: StepRun,
    name: str,
    described: Any,
    owner: Callable[[ObjectKey], str],
    worker: str,
) -> Datum:
    if isinstance(described, dict) and "items" in described:
        items = described["items"]
        return Datum(items=tuple(
            _registered(run, step, f"{name}.{i}", d, owner, worker) for i, d in enumerate(items)
        ))  # fmt: skip
    key, kind = ObjectKey(str(described["key"])), Kind(described["kind"])
    run.objects[key] = Obj(key, kind, int(described.get("nbytes", 0)), owner(key),
                           datum=f"{step.id}.{name}", made_by=worker)  # fmt: skip
    return Datum(key=key, kind=kind)


def _producer(run: RunState, read: Datum | None) -> tuple[str, str]:
    """Which step run made ``read`` and under which name (``input``: the run's input)."""
    if read is None or read.uri:
        return ("input", IMAGE)
    for step_id, data in run.made.items():
        for name, datum in data.items():
            if datum.key == read.key:
                return (step_id, name)
    return ("input", IMAGE)
