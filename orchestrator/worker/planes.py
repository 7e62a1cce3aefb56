"""The data planes a worker runs instructions on, chosen from ``PLANES`` by
``Instruction.data_plane``.

Each plane is one small interface, ``Plane.run(ins, call, exe)``: get the data, run the task
(``call``), put the data where the next step finds it, and record the outcome in ``exe`` (any
failure through ``Execution.fail``, never raised). ``cdi_plane`` hands data over as CDI
objects, and runs a run started without an image too (``none``: it then makes no object but
those its tasks' named outputs need); ``store_plane`` goes through S3 (the object-store
baseline). Each is made from the worker's ``PlaneParts`` (``plane_parts``); the scheduler's
side of each plane is ``orchestrator.scheduler.planes``.

Adding a plane: its module here (a class made from ``PlaneParts``), its row in ``PLANES``, its
tests; the scheduler's side as ``orchestrator.scheduler.planes`` says.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Final, Protocol

from orchestrator.contract.messages import Instruction
from orchestrator.contract.vocabulary import DataPlane
from orchestrator.worker.cdi_plane import CdiPlane
from orchestrator.worker.execution import Execution, TaskCall
from orchestrator.worker.plane_parts import PlaneParts
from orchestrator.worker.store_plane import StorePlane

__all__ = ["PLANES", "Plane", "build_planes"]


class Plane(Protocol):
    def run(self, ins: Instruction, call: TaskCall, exe: Execution) -> None:
        """Run ``ins`` with ``call``; record the outcome, failures included, in ``exe``."""


PLANES: Final[dict[DataPlane, Callable[[PlaneParts], Plane]]] = {
    DataPlane.CDI: CdiPlane,
    DataPlane.OBJECT_STORE: StorePlane,
    DataPlane.NONE: CdiPlane,  # the cdi plane with no image object
}


def build_planes(parts: PlaneParts) -> Mapping[DataPlane, Plane]:
    """Every plane of ``PLANES``, made from ``parts``; rows with the same maker share one
    plane."""
    made: dict[Callable[[PlaneParts], Plane], Plane] = {}
    for make in PLANES.values():
        if make not in made:
            made[make] = make(parts)
    return {plane: made[make] for plane, make in PLANES.items()}
