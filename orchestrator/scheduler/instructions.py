"""What every instruction carries, whatever its plane (``common_fields``; each plane adds its
own, ``planes``), where results go in S3, and the no-op that makes a worker hand objects back.
"""

from __future__ import annotations

import time
from typing import Any, Final

from cdi import ObjectKey
from orchestrator.contract.messages import Instruction
from orchestrator.contract.vocabulary import DataPlane
from orchestrator.objectstore import ObjectStore
from orchestrator.scheduler.context import SchedulerContext
from orchestrator.scheduler.runs import RunState, StepRun
from workflows import imagebuf

__all__ = [
    "RELEASE_TASK",
    "chain_keeps",
    "common_fields",
    "release_instruction",
    "result_stem",
    "result_uri",
    "sole_reader",
    "work_uri",
]

RELEASE_TASK: Final = "workflows.image_tasks:hand_back"  # what makes a worker hand objects back


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


def common_fields(
    ctx: SchedulerContext, run: RunState, step: StepRun, task_run_id: int, queued_at: float
) -> dict[str, Any]:
    """The fields of ``step``'s instruction every plane sends, recorded as task run
    ``task_run_id``."""
    spec = step.current
    return dict(
        task_run_id=task_run_id,
        workflow_id=str(run.workflow_id),
        ref=step.id,
        task=spec.module,
        attempt=step.attempt,
        timeout_s=spec.timeout_s,
        reply_to=ctx.reply_key,
        data_plane=run.data_plane,
        params=spec.params,
        data=run.data,
        queued_at=queued_at,
        chain=step.node.chain,
        channels=run.graph.channel_plan(step.node.ref),
    )


def release_instruction(
    workflow_id: str,
    key: ObjectKey = ObjectKey(""),
    *,
    scheduler_id: str,
    reply_to: str,
    owned: tuple[tuple[ObjectKey, str], ...] = (),
    shared: tuple[tuple[ObjectKey, str], ...] = (),
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


def sole_reader(run: RunState, step: StepRun) -> str | None:
    """In a graph beyond a chain, the one step that reads everything ``step`` makes (a join's
    input, or a plain successor), when ``step``'s worker may hand those objects straight to
    that step's worker: ``step`` is not a sink, an element of a fan-out or a streaming step,
    nor is the reader, which is not in a switch's case either (it may never run). A step in a
    case taken hands on to the join after the switch like any other. None otherwise: the
    objects come back to the scheduler, which shares them with several readers (a fork) or
    holds them until a switch has chosen."""
    graph = run.graph
    if graph.is_chain or step.index is not None or step.node.ref in graph.sinks:
        return None
    readers = {r for name in graph.read_outputs(step.node.ref)
               for r in graph.readers(step.node.ref, name)}  # fmt: skip
    if len(readers) != 1:
        return None
    (reader,) = readers
    in_cases = {r for node in graph.nodes.values() if node.is_switch for r in node.chosen}
    plain = [graph.nodes[ref] for ref in (step.node.ref, reader)]
    if reader in in_cases or any(n.for_each or n.ref in graph.stream_groups for n in plain):
        return None
    return reader
