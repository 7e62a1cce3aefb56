"""Objects in the minion that no run stands for any more, found and freed.

Each workflow's objects are named ``wf-<workflow id>-...`` (``RunState.next_object_key``). A
run driven again, or a fault that took its messages with it (Redis lost a report naming an
object a worker kept), can leave such an object behind: owned by a worker, or by us, and
referenced by nothing. Every ``RECONCILE_S`` the scheduler lists the minion's objects; one
whose workflow is ours (in memory, or ended) and that none of our runs names, seen so twice in
a row, is destroyed when it is ours or asked back from the worker that holds it. *Why twice:*
an object in transit (handed back with a report not read yet) is named by nothing for a moment.
Objects of workflows another scheduler runs are left alone.
"""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING

from sqlalchemy import select

from orchestrator import keys
from orchestrator.db.models import Workflow, WorkflowStatus

if TYPE_CHECKING:
    from orchestrator.scheduler.scheduler import Scheduler

__all__ = ["OrphanObjects"]

log = logging.getLogger(__name__)


class OrphanObjects:
    def __init__(self, scheduler: Scheduler) -> None:
        self.s = scheduler
        self._suspects: set[str] = set()  # keys found orphaned at the last sweep

    def sweep(self) -> None:
        """One look at the minion's objects (skipped while no CDI run was seen)."""
        s = self.s
        if not self._suspects and not any(r.data_plane == "cdi" for r in s.runs.values()):
            return
        named: set[str] = set()
        for run in s.runs.values():
            named.add(run.key)
            if run.in_flight is not None:
                named.update((run.in_flight.key, run.in_flight.output_key))
        found: dict[str, tuple[uuid.UUID, str]] = {}
        for obj in s.cdi.list_objects():
            key = str(obj.get("key", ""))
            workflow_id = keys.workflow_of_object(key)
            if workflow_id is not None and key not in named:
                found[key] = (workflow_id, str(obj.get("owner", "")))
        orphans = self._ours(found)
        act = orphans & self._suspects
        self._suspects = orphans - act
        for key in sorted(act):
            workflow_id, owner = found[key]
            log.warning("object %s of workflow %s is left over (owner %s); freeing it",
                        key, workflow_id, owner)  # fmt: skip
            if owner == s.id:
                s._destroy(key)
            elif owner:
                s._ask_back(str(workflow_id), key, owner)

    def _ours(self, found: dict[str, tuple[uuid.UUID, str]]) -> set[str]:
        """The keys whose workflow this scheduler runs in memory, or that has ended."""
        s = self.s
        others = {w for w, _ in found.values() if w not in s.runs}
        ended: set[uuid.UUID] = set()
        if others:
            with s.sessions() as session:
                rows = session.execute(
                    select(Workflow.id, Workflow.status, Workflow.claimed_by).where(
                        Workflow.id.in_(others)
                    )
                ).all()
            running = WorkflowStatus.RUNNING, WorkflowStatus.PENDING
            ended = {row[0] for row in rows if row[1] not in running}
            ended |= others - {row[0] for row in rows}  # no such workflow at all
        return {key for key, (w, _) in found.items() if w in s.runs or w in ended}
