"""Data planes, the scheduler's side: how a run's data moves between its steps, one module per
``DataPlane``, chosen from ``PLANES`` by the run's plane (``plane_of``).

A plane says what the scheduler plans for a step on it (``base.Plane``): the instruction
(``instruction``), whether a worker may keep what a step makes (``may_keep``; the policy
decides), which graphs it can carry (``problem``); and what it takes in from a report
(``received``) or back from a lost worker (``regain``). The worker's side of each plane is
``orchestrator.worker.planes``.

* ``cdi`` (``cdi.py``, the report's objects in ``objects.py``): CDI objects, handed over;
* ``none`` (``none.py``): a run started without an image, its named data as on ``cdi``;
* ``object-store`` (``object_store.py``): every step through S3 (the baseline).

Adding a plane: its ``DataPlane`` member (a migration adding its label to the ``data_plane``
type, and ``CHOSEN_PLANES`` if a client may start a run on it), a module here and its row in
``PLANES``, the worker's module and its row in ``worker.planes.PLANES``, their tests.
"""

from __future__ import annotations

from typing import Final

from orchestrator.contract.vocabulary import DataPlane
from orchestrator.scheduler.planes.base import Plane, Received
from orchestrator.scheduler.planes.cdi import CdiPlane
from orchestrator.scheduler.planes.none import NonePlane
from orchestrator.scheduler.planes.object_store import ObjectStorePlane
from orchestrator.scheduler.runs import RunState

__all__ = ["PLANES", "Plane", "Received", "plane_of", "uses_objects"]

PLANES: Final[dict[DataPlane, Plane]] = {
    DataPlane.CDI: CdiPlane(),
    DataPlane.OBJECT_STORE: ObjectStorePlane(),
    DataPlane.NONE: NonePlane(),
}


def plane_of(run: RunState) -> Plane:
    """The plane ``run``'s data moves on."""
    return PLANES[run.data_plane]


def uses_objects(run: RunState) -> bool:
    """Whether ``run`` has (or is making) CDI objects."""
    return bool(run.objects) or (plane_of(run).makes_objects and any(True for _ in run.out()))
