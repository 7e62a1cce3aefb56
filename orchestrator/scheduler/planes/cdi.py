"""The ``cdi`` plane, the scheduler's side: a run's data are CDI objects, handed from worker to
worker (straight along a chain and from a step to the one step that reads what it makes, such as
a join; else through the scheduler), and a step's worker gets them by a transfer or a share.

*The instruction.* The step's ``image``, when it reads one object of its own, goes in the
classic fields: ``key`` (made by the worker from ``input_uri`` for the step that reads the
run's input image), ``held`` (an image the worker holds, newer than ``key``), a fresh
``output_key`` for a new image, ``keep`` when the run's policy keeps it there for the next
step, ``hand_to`` when it goes straight on to the next step's worker, ``hold`` when the step
may run again (a lost held image is recomputed). Every other input is in ``inputs`` (an
object owned or shared, an inline value, or a list), every output a later step reads has its
key in ``outputs``, and a step whose outputs are the run's results stores them itself
(``output_uri`` for its image, ``store_prefix`` for the rest): the run ends with its report.
The last step, which stores its image in S3, gets an ``output_key`` too when it reads a held
image: where a failed attempt writes that image for the retry.

*The report* (``received``, ``objects``): where each object the step read is now (handed
back, kept, handed on, destroyed, its share given up), the image it held lost with its worker
(the run rewinds), and the objects it made, registered in the run.

*A lost worker* (``regain``): what it was given comes back to the scheduler by the minion's
recovery rule; the scheduler waits briefly for it, and drops what the worker may have
half-written (``Endings.destroy``: without waiting for it). One that is not on the scheduler's
host is not waited for: if the directory places it on another host (the worker holds it
there, or that host is cut off) the next tick asks again, else it is gone.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Final

import cdi
from cdi import ObjectKey
from orchestrator.contract.messages import Instruction, Report
from orchestrator.contract.vocabulary import TaskRunStatus
from orchestrator.scheduler.context import SchedulerContext
from orchestrator.scheduler.data import Datum, Mode
from orchestrator.scheduler.instructions import common_fields, result_stem, result_uri
from orchestrator.scheduler.planes.base import Plane, Received
from orchestrator.scheduler.planes.objects import follow, made_by
from orchestrator.scheduler.runs import InFlight, RunState, StepRun
from workflows import imagebuf
from workflows.binding import IMAGE

__all__ = ["CdiPlane"]

# The cdi plane's objects hold pixels; a format names only what its last step stores.
_BETWEEN_TASKS: Final = "png"
_REGAIN_WAIT_S: Final = 2.0  # how long a lost worker's object is waited for


class CdiPlane(Plane):
    """Objects handed over by the minion; the image fetched by the first step that reads it."""

    may_keep: ClassVar[bool] = True
    makes_objects: ClassVar[bool] = True

    def instruction(
        self,
        ctx: SchedulerContext,
        run: RunState,
        step: StepRun,
        task_run_id: int,
        queued_at: float,
        *,
        keep: bool,
        hand_to: str = "",
    ) -> Instruction:
        modes = step.modes
        lane = _image_lane(step.reads.get(IMAGE), modes)
        inputs = {
            name: _described(datum, modes)
            for name, datum in step.reads.items()
            if not (name == IMAGE and lane is not None)
        }
        fields = common_fields(ctx, run, step, task_run_id, queued_at)
        fields |= dict(inputs=inputs, return_to=ctx.id)
        if lane is not None:
            obj = run.objects.get(lane.key)
            fetch = bool(lane.uri)
            fields |= dict(
                key=run.next_object_key() if fetch else lane.key,
                input_uri=lane.uri,
                held=obj.held if obj is not None else "",
            )
        read = run.graph.read_outputs(step.node.ref)
        if step.node.ref in run.graph.sinks:
            single = len(run.graph.sinks) == 1 and step.index is None
            stem = result_stem(ctx.objects, run, step)
            extension = imagebuf.RESULT_FORMATS[run.result_format].extension
            fields |= dict(
                output_uri=result_uri(ctx.objects, run) if single else f"{stem}{IMAGE}{extension}",
                output_format=run.result_format,
                store_prefix=stem,
            )
            if fields.get("held"):
                # The image it reads is only in its worker's memory: if the attempt fails (S3
                # did not take the result), the worker writes it here for the retry instead of
                # losing it, which would run the steps that made it again.
                fields["output_key"] = ObjectKey(f"{run.next_object_key()}.{IMAGE}")
        else:
            base = run.next_object_key()
            fields |= dict(
                output_key=ObjectKey(f"{base}.{IMAGE}" if IMAGE in read else ""),
                outputs={name: ObjectKey(f"{base}.{name}") for name in sorted(read - {IMAGE})},
                discard_image=IMAGE not in read,
                keep=keep,
                hand_to=hand_to,
                # Only a step that may run again holds: a lost held image is recomputed.
                hold=keep and lane is not None and step.current.retries > 0 and _holds(run, step),
                output_format=_BETWEEN_TASKS,
            )
        return Instruction(**fields)

    def received(
        self, ctx: SchedulerContext, run: RunState, step: StepRun, report: Report, sent: Instruction
    ) -> Received:
        completed = report.status == TaskRunStatus.COMPLETED
        got = follow(ctx, run, step, report, sent)
        if completed and not got.lost:
            got.made = made_by(ctx, run, step, report, sent)
            got.results = dict(report.results)
        return got

    def regain(
        self,
        ctx: SchedulerContext,
        run: RunState,
        step: StepRun,
        flight: InFlight,
        drop: Callable[[ObjectKey], None],
    ) -> bool:
        """Wait briefly for the step's objects to come back by the minion's recovery rule;
        False while the worker still holds one (one on another host is not waited for:
        ``_held_elsewhere``). An object the worker was making from the S3 input may be
        half-written: it is dropped like a half-written output, and the retry fetches the
        input again. A dead worker's shares end with it (a live one's, of an instruction it never
        popped, are asked back: ``Recovery._give_up``)."""
        lost = flight.instruction
        fetched = lost.key if lost.input_uri else ObjectKey("")
        owned = [k for k, m in step.modes.items() if m is Mode.OWN]
        here = {str(o.get("key", "")) for o in ctx.cdi.list_objects()}
        for key in [fetched] if fetched else owned:
            if key not in here:
                if _held_elsewhere(ctx, key):
                    return False  # on the worker's host: it holds it, or its host is cut off
                continue  # gone
            try:
                with ctx.cdi.use(key, check=False).view(timeout=_REGAIN_WAIT_S):
                    pass
            except cdi.AccessTimeout:
                return False
            except cdi.ObjectNotFound:
                pass
        if fetched:
            drop(fetched)
        for key in owned:
            obj = run.objects.get(key)
            if obj is not None:
                obj.owner = ctx.id
        for key, mode in step.modes.items():
            obj = run.objects.get(key)
            if mode is Mode.READ and obj is not None:
                obj.read_failed(flight.worker)
        for key in [lost.output_key, *lost.outputs.values()]:
            if key:
                drop(key)
        return True


def _held_elsewhere(ctx: SchedulerContext, key: ObjectKey) -> bool:
    """Whether the directory places ``key`` on another host. *Why ask it, not wait for the
    object:* waiting for one held on a host that is cut off took the loop seconds per step and
    tick, during which no workflow moved; the recovery rule brings it here if its holder dies,
    and a later tick sees it."""
    try:
        host = ctx.cdi.located(key)
    except cdi.CDIError:
        return True  # the directory is away: look again at the next tick
    return host is not None and host != ctx.cdi.host


def _image_lane(datum: Datum | None, modes: Mapping[ObjectKey, Mode]) -> Datum | None:
    """The step's image when it goes in the classic fields: the run's input image (fetched
    by this step), or one object handed to its worker."""
    if datum is None:
        return None
    if datum.uri:
        return datum
    if datum.is_object and modes.get(datum.key) is Mode.OWN:
        return datum
    return None


def _holds(run: RunState, step: StepRun) -> bool:
    """Whether its new image may stay in its worker's memory: along a chain, one step reads
    it, as its own classic image, and that step does not fan out (a graph's step kept for a
    join writes its image: the recomputing of a lost one follows a chain)."""
    readers = run.graph.readers(step.node.ref, IMAGE)
    if not run.graph.is_chain or len(readers) != 1 or step.index is not None:
        return False
    reader = run.graph.nodes[readers[0]]
    return reader.for_each is None and len(reader.inputs.get(IMAGE, ())) == 1


def _described(datum: Datum, modes: Mapping[ObjectKey, Mode]) -> dict[str, Any]:
    if datum.items is not None:
        return {"items": [_described(item, modes) for item in datum.items]}
    if datum.is_object:
        return {"key": datum.key, "kind": str(datum.kind), "mode": str(modes[datum.key])}
    return {"value": datum.value}
