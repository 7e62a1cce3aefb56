"""The instruction a worker gets for a run's step, on the run's data plane, and where results
go in S3.

* ``cdi``: the object ``key`` (made by the first task's worker from ``input_uri``), a fresh
  ``output_key`` for a new image, ``keep`` under ``affinity`` but for the last step (and a
  next step the worker did not load: the object then comes back and moves on), ``hold``
  when the step may run again (a lost held image is recomputed), and for the last step the
  result's ``output_uri``: its worker stores the result and the workflow ends with the report.
* ``object-store``: the previous step's output (or the input) as ``input_uri`` and where this
  step's goes (``work_uri``, in the run's ``intermediate_format``; the last step's is the
  result).
* ``none``: a dataless run's step carries only its parameters and the workflow's data.
"""

from __future__ import annotations

import time
from typing import Any, Final

from orchestrator.contract.messages import Instruction
from orchestrator.contract.vocabulary import DataPlane, Policy
from orchestrator.objectstore import ObjectStore
from orchestrator.scheduler.runs import RunState, StepSpec
from workflows import imagebuf

__all__ = ["RELEASE_TASK", "instruction_for", "release_instruction", "result_uri", "work_uri"]

RELEASE_TASK: Final = "workflows.image_tasks:noop"  # what a worker runs to hand an object back
# The cdi plane's objects hold pixels; a format names only what its last step stores.
_BETWEEN_TASKS: Final = "png"


def result_uri(objects: ObjectStore, run: RunState) -> str:
    """Where the run's result goes: under the results prefix (``CDIFLOW_S3_RESULTS``)."""
    name = f"{run.workflow_id}{imagebuf.RESULT_FORMATS[run.result_format].extension}"
    return objects.policy.result_uri(name)


def work_uri(objects: ObjectStore, run: RunState, step: StepSpec) -> str:
    """Where an object-store step's image goes (its attempt's own), under ``work/``, in the
    run's ``intermediate_format``."""
    extension = imagebuf.RESULT_FORMATS[run.intermediate_format].extension
    return objects.policy.work_uri(f"{run.workflow_id}/{step.ref}-{run.attempt}{extension}")


def instruction_for(
    run: RunState,
    task_run_id: int,
    queued_at: float,
    *,
    scheduler_id: str,
    reply_to: str,
    objects: ObjectStore,
    runs_next: bool = True,
) -> Instruction:
    """The instruction for the run's current step, recorded as task run ``task_run_id``;
    ``runs_next``: whether its worker loaded the next step's module too."""
    step = run.current
    common: dict[str, Any] = dict(
        task_run_id=task_run_id,
        workflow_id=str(run.workflow_id),
        ref=step.ref,
        task=step.module,
        attempt=run.attempt,
        timeout_s=step.timeout_s,
        reply_to=reply_to,
        data_plane=run.data_plane,
        params=step.params,
        data=run.data,
        queued_at=queued_at,
    )
    last = run.last_step
    if run.data_plane == DataPlane.NONE:
        return Instruction(**common)
    if run.data_plane == DataPlane.CDI:
        keep = run.policy == Policy.AFFINITY and not last and runs_next
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
            return_to=scheduler_id,
            # The last task's worker stores the result: no copy into an object, no
            # hand-back, and the workflow ends with the report's own statement.
            output_uri=result_uri(objects, run) if last else "",
            output_format=run.result_format if last else _BETWEEN_TASKS,
        )
    return Instruction(
        **common,
        input_uri=run.current_uri,
        output_uri=result_uri(objects, run) if last else work_uri(objects, run, step),
        output_format=run.result_format if last else run.intermediate_format,
    )


def release_instruction(
    workflow_id: str, key: str, *, scheduler_id: str, reply_to: str
) -> Instruction:
    """A no-op that makes the worker holding object ``key`` of a workflow hand it back."""
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
    )
