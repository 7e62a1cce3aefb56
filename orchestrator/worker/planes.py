"""The data planes a worker runs instructions on, chosen by ``Instruction.data_plane``.

Each plane is one small interface, ``run(ins, call, exe)``: get the image, run the task
(``call``), put the image where the next step finds it, and record the outcome in ``exe``
(any failure through ``Execution.fail``, never raised). ``cdi_plane`` hands images over as CDI
objects, ``store_plane`` through S3 (the object-store baseline), and ``DatalessPlane`` runs
tasks that take no image.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from orchestrator.contract.messages import Instruction
from orchestrator.contract.vocabulary import DataPlane
from orchestrator.worker.execution import Execution, TaskCall, check_common

__all__ = ["DatalessPlane", "Plane", "plane_table"]


class Plane(Protocol):
    def run(self, ins: Instruction, call: TaskCall, exe: Execution) -> None:
        """Run ``ins`` with ``call``; record the outcome, failures included, in ``exe``."""


class DatalessPlane:
    """A dataless workflow's task: no object, no S3, only the JSON output travels."""

    def run(self, ins: Instruction, call: TaskCall, exe: Execution) -> None:
        try:
            check_common(ins)
            call.run_dataless(call.load(), exe)
        except Exception as exc:
            exe.fail(exc)


def plane_table(cdi: Plane, object_store: Plane) -> Mapping[DataPlane, Plane]:
    """Every ``DataPlane`` with the plane that runs it."""
    return {
        DataPlane.CDI: cdi,
        DataPlane.OBJECT_STORE: object_store,
        DataPlane.NONE: DatalessPlane(),
    }
