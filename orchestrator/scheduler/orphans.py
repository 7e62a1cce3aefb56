"""Objects on any host that no run stands for any more, found and freed.

Each workflow's objects are named ``wf-<workflow id>-...`` (``RunState.next_object_key``, and
``.<output>`` or ``.<output>.<i>`` after it for named data). A
run driven again, or a fault that took its messages with it (Redis lost a report naming an
object a worker kept), can leave such an object behind: owned by a worker, or by us, and
referenced by nothing, on any host. Every ``RECONCILE_S`` the scheduler lists the objects of
every host (``object_directory``: its own minion's, and the other hosts' from the CDI
controller's directory); one
whose workflow is ours (in memory, or ended) and that none of our runs names, seen so twice in
a row, is destroyed when it is ours or asked back from the worker that holds it. *Why twice:*
an object in transit (handed back with a report not read yet) is named by nothing for a moment.
Objects of workflows another scheduler runs are left alone.
"""

from __future__ import annotations

import logging
import uuid

from cdi import ObjectKey
from orchestrator.contract import keys
from orchestrator.contract.vocabulary import WorkflowStatus
from orchestrator.scheduler.context import SchedulerContext
from orchestrator.scheduler.endings import Endings
from orchestrator.scheduler.object_directory import ObjectDirectory
from orchestrator.scheduler.planes import uses_objects

__all__ = ["OrphanObjects"]

log = logging.getLogger(__name__)


class OrphanObjects:
    """Finds the objects of our workflows that nothing names, and frees them."""

    def __init__(self, ctx: SchedulerContext, endings: Endings, directory: ObjectDirectory) -> None:
        self.ctx = ctx
        self.endings = endings
        self.directory = directory
        self._suspects: set[ObjectKey] = set()  # keys found orphaned at the last sweep

    def sweep(self) -> None:
        """One look at every host's objects (skipped while no CDI run was seen)."""
        ctx = self.ctx
        if not self._suspects and not any(uses_objects(r) for r in ctx.runs.values()):
            return
        named: set[ObjectKey] = set()
        prefixes: list[str] = []  # list outputs out at a worker: "<key>.<i>"
        for run in ctx.runs.values():
            named.update(run.objects)
            for step in run.out():
                assert step.in_flight is not None
                sent = step.in_flight.instruction
                named.update((sent.key, sent.output_key, *sent.outputs.values()))
                prefixes += [f"{k}." for k in sent.outputs.values()]
        found: dict[ObjectKey, tuple[uuid.UUID, str]] = {}
        for key, owner in self.directory.objects():
            workflow_id = keys.workflow_of_object(key)
            if workflow_id is not None and key not in named and not key.startswith(tuple(prefixes)):
                found[key] = (workflow_id, owner)
        orphans = self._ours(found)
        act = orphans & self._suspects
        self._suspects = orphans - act
        for key in sorted(act):
            workflow_id, owner = found[key]
            log.warning("object %s of workflow %s is left over (owner %s); freeing it",
                        key, workflow_id, owner)  # fmt: skip
            if owner == ctx.id:
                self.endings.destroy(key)
            elif owner:
                self.endings.ask_back(str(workflow_id), owner, key)

    def _ours(self, found: dict[ObjectKey, tuple[uuid.UUID, str]]) -> set[ObjectKey]:
        """The keys whose workflow this scheduler runs in memory, or that has ended."""
        runs = self.ctx.runs
        others = {w for w, _ in found.values() if w not in runs}
        ended: set[uuid.UUID] = set()
        if others:
            statuses = self.ctx.db.statuses(others)
            running = WorkflowStatus.RUNNING, WorkflowStatus.PENDING
            ended = {w for w in others if statuses.get(w, WorkflowStatus.FAILED) not in running}
        return {key for key, (w, _) in found.items() if w in runs or w in ended}
