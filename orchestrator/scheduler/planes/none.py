"""The ``none`` plane: a run started without an image. Its named data moves as on the ``cdi``
plane; no step fetches an image, and no worker keeps what a step makes for the next."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from cdi import ObjectKey
from orchestrator.scheduler.context import SchedulerContext
from orchestrator.scheduler.planes.cdi import CdiPlane
from orchestrator.scheduler.runs import InFlight, RunState, StepRun

__all__ = ["NonePlane"]


class NonePlane(CdiPlane):
    """The ``cdi`` plane without the run's image."""

    may_keep: ClassVar[bool] = False
    makes_objects: ClassVar[bool] = False

    def regain(
        self,
        ctx: SchedulerContext,
        run: RunState,
        step: StepRun,
        flight: InFlight,
        drop: Callable[[ObjectKey], None],
    ) -> bool:
        return True  # no image object to wait for
