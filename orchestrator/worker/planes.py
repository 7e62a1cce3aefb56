"""The data planes a worker runs instructions on, chosen by ``Instruction.data_plane``.

Each plane is one small interface, ``run(ins, call, exe)``: get the data, run the task
(``call``), put the data where the next step finds it, and record the outcome in ``exe`` (any
failure through ``Execution.fail``, never raised). ``cdi_plane`` hands data over as CDI
objects, and runs a run started without an image too (``none``: it then makes no object but
those its tasks' named outputs need); ``store_plane`` goes through S3 (the object-store
baseline).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from orchestrator.contract.messages import Instruction
from orchestrator.contract.vocabulary import DataPlane
from orchestrator.worker.execution import Execution, TaskCall

__all__ = ["Plane", "plane_table"]


class Plane(Protocol):
    def run(self, ins: Instruction, call: TaskCall, exe: Execution) -> None:
        """Run ``ins`` with ``call``; record the outcome, failures included, in ``exe``."""


def plane_table(cdi: Plane, object_store: Plane) -> Mapping[DataPlane, Plane]:
    """Every ``DataPlane`` with the plane that runs it."""
    return {DataPlane.CDI: cdi, DataPlane.OBJECT_STORE: object_store, DataPlane.NONE: cdi}
