"""The Temporal peer: one workflow whose activities are the image operations, each via S3.

A ``BenchChain`` workflow runs its operations in turn as the activity ``image_step``; an
activity is handed the previous one's output URI (never pixels: Temporal's payloads are
meant for references, not megabytes) and runs ``pipeline_ops.s3_step`` as Celery's and
Conductor's tasks do: GET, decode, operate, encode in the run's intermediate format, PUT.
No retries: a failed activity fails its workflow, as everywhere in the benchmark. The
workflow's result is the last activity's value, whose ``stored_at`` is the moment the
result's PUT returned.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Final

from temporalio import activity, workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():  # not workflow code: kept out of the sandbox
    from loadtest.pipeline_ops import DEFAULT_INTERMEDIATE, s3_step

__all__ = [
    "PREFIX",
    "TASK_QUEUE",
    "WORKFLOW",
    "BenchChain",
    "ChainInput",
    "StepInput",
    "image_step",
]

PREFIX: Final = "temporal/"  # every object this peer writes, cleared between points
TASK_QUEUE: Final = "cdiflow-bench"
WORKFLOW: Final = "BenchChain"
_STEP_TIMEOUT: Final = timedelta(minutes=10)


@dataclass
class ChainInput:
    image: str  # S3 URI of the input
    ops: list[str]
    workflow_id: str
    intermediate: str = DEFAULT_INTERMEDIATE


@dataclass
class StepInput:
    op: str
    source: str  # S3 URI of this step's input
    workflow_id: str
    step: int
    last: bool
    intermediate: str = DEFAULT_INTERMEDIATE
    carried: dict[str, Any] = field(default_factory=dict)  # the previous step's value


@activity.defn(name="image_step")
def image_step(args: StepInput) -> dict[str, Any]:
    return s3_step(
        PREFIX,
        args.op,
        args.source,
        workflow_id=args.workflow_id,
        step=args.step,
        last=args.last,
        intermediate=args.intermediate,
        carried=args.carried,
    )


@workflow.defn(name=WORKFLOW)
class BenchChain:
    @workflow.run
    async def run(self, args: ChainInput) -> dict[str, Any]:
        carried: dict[str, Any] = {}
        source = args.image
        for i, op in enumerate(args.ops):
            step = StepInput(
                op, source, args.workflow_id, i, i == len(args.ops) - 1, args.intermediate, carried
            )
            carried = await workflow.execute_activity(
                image_step,
                step,
                start_to_close_timeout=_STEP_TIMEOUT,
                retry_policy=RetryPolicy(maximum_attempts=1),
            )
            source = str(carried["uri"])
        return carried
