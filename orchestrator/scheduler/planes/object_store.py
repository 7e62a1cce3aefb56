"""The ``object-store`` plane, the scheduler's side: like Conductor/Orkes users do, every step
GETs its image from S3 and PUTs what it makes there; nothing goes through the scheduler.

A step's image is the step before's output (``work_uri``, in the run's
``intermediate_format``), or the run's input; the last step's goes to the result. One image
moves from step to step: single-image chains only (``problem``).
"""

from __future__ import annotations

from orchestrator.contract.messages import Instruction, Report
from orchestrator.contract.vocabulary import TaskRunStatus
from orchestrator.scheduler.context import SchedulerContext
from orchestrator.scheduler.instructions import common_fields, result_uri, work_uri
from orchestrator.scheduler.planes.base import Plane, Received
from orchestrator.scheduler.runs import RunState, StepRun
from workflows.binding import IMAGE
from workflows.graph import Graph

__all__ = ["ObjectStorePlane"]


class ObjectStorePlane(Plane):
    """Every step's image in S3."""

    def problem(self, graph: Graph) -> str | None:
        if graph.is_chain:
            return None
        return (
            "is not one chain of steps: the object-store plane carries one image from step "
            "to step; start it on the cdi plane"
        )

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
        sink = step.node.ref in run.graph.sinks
        return Instruction(
            **common_fields(ctx, run, step, task_run_id, queued_at),
            input_uri=self._input_uri(ctx, run, step),
            output_uri=result_uri(ctx.objects, run) if sink else work_uri(ctx.objects, run, step),
            output_format=run.result_format if sink else run.intermediate_format,
        )

    def received(
        self, ctx: SchedulerContext, run: RunState, step: StepRun, report: Report, sent: Instruction
    ) -> Received:
        if report.status != TaskRunStatus.COMPLETED:
            return Received()
        got = Received(made={}, results=dict(report.results))
        if IMAGE in step.reads:
            got.made = {IMAGE: step.reads[IMAGE]}  # in S3 at ``sent.output_uri``
        if step.node.ref in run.graph.sinks:
            got.results[IMAGE] = sent.output_uri  # every step of this plane PUTs its image
        return got

    @staticmethod
    def _input_uri(ctx: SchedulerContext, run: RunState, step: StepRun) -> str:
        """Where the step's image is: the step before's output, or the input."""
        before = [r for r in step.node.after if r in run.steps]
        if not before:
            return run.input_uri
        return work_uri(ctx.objects, run, run.steps[before[0]])
