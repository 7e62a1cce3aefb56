"""The instruction a worker gets for a step run, on the run's data plane, and where results go
in S3.

* ``cdi`` (and ``none``, a run without an input image): the step's ``image``, when it reads
  one object of its own, goes in the classic fields — ``key`` (made by the worker from
  ``input_uri`` for the step that reads the run's input image), ``held`` (an image the worker
  holds, newer than ``key``), a fresh ``output_key`` for a new image, ``keep`` under
  ``affinity`` and, when the next step is predicted to stay, ``auto`` (the next step comes to
  the same worker), ``hold`` when the step may run again (a lost held image is recomputed).
  The last step, which stores its image in S3, gets an ``output_key`` too when it reads a held
  image: where a failed attempt writes that image for the retry.
  Every other input is in ``inputs`` (an object owned or shared, an inline value, or a list),
  every output a later step reads has its key in ``outputs``, and a step whose outputs are the
  run's results stores them itself (``output_uri`` for its image, ``store_prefix`` for the
  rest): the run ends with its report.
* ``object-store``: the previous step's output (or the input) as ``input_uri`` and where this
  step's goes (``work_uri``, in the run's ``intermediate_format``; the last step's is the
  result): single-image chains only.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Final

from orchestrator.contract.messages import Instruction
from orchestrator.contract.vocabulary import DataPlane
from orchestrator.objectstore import ObjectStore
from orchestrator.scheduler.data import Datum, Mode
from orchestrator.scheduler.runs import RunState, StepRun
from workflows import imagebuf
from workflows.binding import IMAGE

__all__ = [
    "RELEASE_TASK",
    "chain_keeps",
    "instruction_for",
    "release_instruction",
    "result_stem",
    "result_uri",
    "work_uri",
]

RELEASE_TASK: Final = "workflows.image_tasks:hand_back"  # what makes a worker hand objects back
# The cdi plane's objects hold pixels; a format names only what its last step stores.
_BETWEEN_TASKS: Final = "png"


def result_uri(objects: ObjectStore, run: RunState) -> str:
    """Where the run's image result goes when it has one sink: under the results prefix
    (``CDIFLOW_S3_RESULTS``), named after the run."""
    name = f"{run.workflow_id}{imagebuf.RESULT_FORMATS[run.result_format].extension}"
    return objects.policy.result_uri(name)


def result_stem(objects: ObjectStore, run: RunState, step: StepRun) -> str:
    """The S3 prefix of a sink step run's results: ``<results>/<run>/<step>.``."""
    name = step.id.replace("[", "-").replace("]", "")
    return objects.policy.result_uri(f"{run.workflow_id}/{name}.")


def work_uri(objects: ObjectStore, run: RunState, step: StepRun) -> str:
    """Where an object-store step's image goes (its attempt's own), under ``work/``, in the
    run's ``intermediate_format``."""
    extension = imagebuf.RESULT_FORMATS[run.intermediate_format].extension
    name = f"{run.workflow_id}/{step.id}-{step.attempt}{extension}"
    return objects.policy.work_uri(name)


def instruction_for(
    run: RunState,
    step: StepRun,
    task_run_id: int,
    queued_at: float,
    modes: Mapping[str, Mode],
    *,
    scheduler_id: str,
    reply_to: str,
    objects: ObjectStore,
    keep: bool = False,
    object_store_uri: str = "",
) -> Instruction:
    """The instruction for ``step``, recorded as task run ``task_run_id``; ``modes`` how it
    reads each object (as moved to its worker), ``keep`` whether its worker keeps what it
    makes (the next step comes to it too)."""
    spec = step.current
    common: dict[str, Any] = dict(
        task_run_id=task_run_id,
        workflow_id=str(run.workflow_id),
        ref=step.id,
        task=spec.module,
        attempt=step.attempt,
        timeout_s=spec.timeout_s,
        reply_to=reply_to,
        data_plane=run.data_plane,
        params=spec.params,
        data=run.data,
        queued_at=queued_at,
        chain=step.node.chain,
    )
    sink = step.node.ref in run.graph.sinks
    if run.data_plane == DataPlane.OBJECT_STORE:
        return Instruction(
            **common,
            input_uri=object_store_uri,
            output_uri=result_uri(objects, run) if sink else work_uri(objects, run, step),
            output_format=run.result_format if sink else run.intermediate_format,
        )
    lane = _image_lane(step.reads.get(IMAGE), modes)
    inputs = {
        name: _described(datum, modes)
        for name, datum in step.reads.items()
        if not (name == IMAGE and lane is not None)
    }
    fields: dict[str, Any] = dict(common, inputs=inputs, return_to=scheduler_id)
    if lane is not None:
        obj = run.objects.get(lane.key)
        fetch = bool(lane.uri)
        fields |= dict(
            key=run.next_object_key() if fetch else lane.key,
            input_uri=lane.uri,
            held=obj.held if obj is not None else "",
        )
    read = run.graph.read_outputs(step.node.ref)
    if sink:
        single = len(run.graph.sinks) == 1 and step.index is None
        stem = result_stem(objects, run, step)
        fields |= dict(
            output_uri=result_uri(objects, run)
            if single
            else f"{stem}{IMAGE}" + imagebuf.RESULT_FORMATS[run.result_format].extension,
            output_format=run.result_format,
            store_prefix=stem,
        )
        if fields.get("held"):
            # The image it reads is only in its worker's memory: if the attempt fails (S3
            # did not take the result), the worker writes it here for the retry instead of
            # losing it, which would run the steps that made it again.
            fields["output_key"] = f"{run.next_object_key()}.{IMAGE}"
    else:
        base = run.next_object_key()
        fields |= dict(
            output_key=f"{base}.{IMAGE}" if IMAGE in read else "",
            outputs={name: f"{base}.{name}" for name in sorted(read - {IMAGE})},
            discard_image=IMAGE not in read,
            keep=keep,
            # Only a step that may run again holds: a lost held image is recomputed.
            hold=keep and lane is not None and spec.retries > 0 and _holds(run, step),
            output_format=_BETWEEN_TASKS,
        )
    return Instruction(**fields)


def _image_lane(datum: Datum | None, modes: Mapping[str, Mode]) -> Datum | None:
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
    """Whether its new image may stay in its worker's memory: one step reads it, as its own
    classic image, and that step does not fan out."""
    readers = run.graph.readers(step.node.ref, IMAGE)
    if len(readers) != 1 or step.index is not None:
        return False
    reader = run.graph.nodes[readers[0]]
    return reader.for_each is None and len(reader.inputs.get(IMAGE, ())) == 1


def _described(datum: Datum, modes: Mapping[str, Mode]) -> dict[str, Any]:
    if datum.items is not None:
        return {"items": [_described(item, modes) for item in datum.items]}
    if datum.is_object:
        return {"key": datum.key, "kind": str(datum.kind), "mode": str(modes[datum.key])}
    return {"value": datum.value}


def release_instruction(
    workflow_id: str,
    key: str = "",
    *,
    scheduler_id: str,
    reply_to: str,
    owned: tuple[tuple[str, str], ...] = (),
    shared: tuple[tuple[str, str], ...] = (),
) -> Instruction:
    """A no-op that makes a worker hand object ``key`` of a workflow back, destroy the objects
    ``owned`` and give up its shares of ``shared`` ((key, kind) pairs)."""
    inputs = {f"owned{i}": {"key": k, "kind": kind, "mode": "own"}
              for i, (k, kind) in enumerate(owned)}  # fmt: skip
    inputs |= {f"shared{i}": {"key": k, "kind": kind, "mode": "read"}
               for i, (k, kind) in enumerate(shared)}  # fmt: skip
    return Instruction(
        task_run_id=0,
        workflow_id=workflow_id,
        ref="release",
        task=RELEASE_TASK,
        attempt=1,
        timeout_s=30,
        reply_to=reply_to,
        data_plane=DataPlane.CDI,
        key=key,
        keep=False,
        return_to=scheduler_id,
        queued_at=time.time(),
        inputs=inputs,
    )


def chain_keeps(run: RunState, step: StepRun) -> bool:
    """Whether the worker may keep what ``step`` makes for the next step (``affinity`` always
    does when it may, ``auto`` when the next step is predicted to stay): every datum it makes
    that a step reads is read by exactly one step, which does not fan out (the scheduler
    shares objects with several readers, so it must own those). Only along a chain: in a
    graph every object comes back to the scheduler, which alone moves objects between the
    workers its steps are spread over."""
    if not run.graph.is_chain or step.node.ref in run.graph.sinks:
        return False
    for name in run.graph.read_outputs(step.node.ref):
        readers = run.graph.readers(step.node.ref, name)
        if len(readers) != 1 or run.graph.nodes[readers[0]].for_each is not None:
            return False
    return True
