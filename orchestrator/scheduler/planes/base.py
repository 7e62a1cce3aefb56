"""What a data plane is on the scheduler's side (``Plane``): what the scheduler plans for a
step on it, and what it takes in from the step's report.

The worker's side of each plane is ``orchestrator.worker.planes``; the two meet in the
``Instruction`` and the ``Report`` (``contract.messages``).
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

from cdi import ObjectKey
from orchestrator.contract.messages import Instruction, Report
from orchestrator.scheduler.context import SchedulerContext
from orchestrator.scheduler.data import Datum
from orchestrator.scheduler.runs import InFlight, RunState, StepRun
from workflows.graph import Graph

__all__ = ["Plane", "Received"]


@dataclass
class Received:
    """What a report says of its run's data, as the run's plane took it in."""

    # The image the step read was only in its worker's memory and is gone with it: the
    # steps that made it run again (``progress.rewind``), and the report ends nothing.
    lost: bool = False
    # Objects the step read through shares: their reads end once its outputs are known.
    shared: list[ObjectKey] = field(default_factory=list)
    made: dict[str, Datum] | None = None  # what it made (None: it did not complete)
    results: dict[str, str] = field(default_factory=dict)  # output -> S3 URI it is stored at


class Plane(abc.ABC):
    """How a run's data moves between its steps, as the scheduler plans it: one subclass per
    ``DataPlane``, chosen from ``PLANES``."""

    may_keep: ClassVar[bool] = False
    """A worker may keep what a step makes for the next step (whether it does is the run's
    policy's call, ``PlacementPolicy.keeps``)."""

    makes_objects: ClassVar[bool] = False
    """A step out at a worker may be making CDI objects of the run (its image), which a
    minion that restarts takes with it."""

    def problem(self, graph: Graph) -> str | None:
        """Why this plane cannot carry ``graph``'s data (None: it can); the run then fails
        with it. Default: any graph."""
        return None

    @abc.abstractmethod
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
        """The instruction for ``step``, recorded as task run ``task_run_id``; ``keep``:
        its worker keeps what it makes (the next step comes to it too); ``hand_to``: its
        worker hands what it makes straight to that worker, the next step's (planes that
        may keep only)."""

    @abc.abstractmethod
    def received(
        self, ctx: SchedulerContext, run: RunState, step: StepRun, report: Report, sent: Instruction
    ) -> Received:
        """Take in what ``report`` (of ``sent``) says of the run's data: where the objects
        the step read are now, what it made, what it stored."""

    def regain(
        self,
        ctx: SchedulerContext,
        run: RunState,
        step: StepRun,
        flight: InFlight,
        drop: Callable[[ObjectKey], None],
    ) -> bool:
        """``flight``'s worker is presumed lost: take back what it was given, waiting briefly
        for it; False while the worker still holds some of it (it is alive after all).
        What the worker may have half-written goes to ``drop`` (destroyed without a wait).
        Default: it was given nothing."""
        return True
