"""Which workflows this scheduler runs: PENDING ones it claims, and its own RUNNING ones that no
run in memory stands for (after a restart, a resync with Postgres, or a take-over from a dead
scheduler), which start over from their input (their CDI objects are gone or not trusted),
every step's attempts going on from the last one Postgres has (``Claimed.attempts``).

Several schedulers may run: a claim takes rows with ``SKIP LOCKED`` (``run_statements.CLAIM``),
so none is claimed twice, and takes at most ``CLAIM_BATCH`` while fewer than
``max_active_workflows`` are this scheduler's. A claimed workflow becomes a ``RunState``
(``plan``); one that cannot run (its definition gone, or not a chain) fails with the reason.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Final

from orchestrator.contract.vocabulary import DataPlane, WorkflowStatus
from orchestrator.db.run_statements import Claimed, Finish
from orchestrator.errors import OrchestratorError
from orchestrator.scheduler.context import SchedulerContext
from orchestrator.scheduler.dispatch import Dispatcher
from orchestrator.scheduler.endings import Endings
from orchestrator.scheduler.guarded import guarded
from orchestrator.scheduler.runs import RunState, StepSpec
from orchestrator.settings import Settings
from workflows import imagebuf
from workflows.definitions import chain_problems

__all__ = ["CLAIM_AGAIN_AT", "CLAIM_BATCH", "RECLAIM_AFTER_S", "Claims", "plan"]

CLAIM_BATCH: Final = 32
RECLAIM_AFTER_S: Final = 60.0  # a claim older than this without progress is taken over
# With a backlog, claim again once this many runs have ended (a claim per run would cost a
# round trip per workflow; the tick claims anyway).
CLAIM_AGAIN_AT: Final = 8

log = logging.getLogger(__name__)


class Claims:
    """Takes workflows to run and starts them."""

    def __init__(
        self, ctx: SchedulerContext, settings: Settings, dispatch: Dispatcher, endings: Endings
    ) -> None:
        self.ctx = ctx
        self.settings = settings
        self.dispatch = dispatch
        self.endings = endings
        self.backlog = False  # PENDING workflows may be waiting for room

    def room(self) -> int:
        """How many more workflows this scheduler may run."""
        return self.settings.max_active_workflows - len(self.ctx.runs)

    def due(self) -> bool:
        """Whether enough runs ended, with others waiting, to claim again before the tick."""
        again_at = min(CLAIM_AGAIN_AT, self.settings.max_active_workflows)
        return self.backlog and self.room() >= again_at

    def claim(self) -> None:
        """Take PENDING workflows while fewer than ``max_active_workflows`` are ours."""
        room = self.room()
        if room <= 0:
            self.backlog = True
            return
        want = min(CLAIM_BATCH, room)
        claims = self.ctx.db.claim(self.ctx.id, want, RECLAIM_AFTER_S)
        self.backlog = len(claims) == want  # a full batch: more may be waiting
        self._start(claims)

    def resume(self, reason: str) -> None:
        """Start over our RUNNING workflows that no run in memory stands for, saying why."""
        claims = self.ctx.db.resume(self.ctx.id, reason, running=list(self.ctx.runs))
        if claims:
            log.warning("resuming %d workflow(s) from their input: %s", len(claims), reason)
        self._start(claims)

    def _start(self, claims: list[Claimed]) -> None:
        for claimed in claims:
            try:
                run = plan(claimed)
            except OrchestratorError as exc:
                failed = Finish(claimed.id, WorkflowStatus.FAILED, error=str(exc))
                self.endings.ended(claimed.id, self.ctx.db.finish(failed))
                continue
            self.ctx.runs[run.workflow_id] = run
            guarded(functools.partial(self.dispatch.dispatch, run), self.ctx.faults)


def plan(claimed: Claimed) -> RunState:
    """The in-memory run of a claimed workflow; ``OrchestratorError`` if it cannot run."""
    if claimed.steps is None:
        raise OrchestratorError(f"workflow definition {claimed.definition!r} is gone")
    # A definition stored before forks and joins were refused would run as a wrong chain.
    if problems := chain_problems(claimed.steps):
        raise OrchestratorError(
            f"workflow definition {claimed.definition!r} cannot run: {'; '.join(problems)}"
        )
    steps = []
    for step in _ordered(claimed.steps):
        spec = claimed.task_defs.get(step["task"])
        if spec is None:
            raise OrchestratorError(f"task {step['task']!r} of step {step['ref']!r} is gone")
        steps.append(
            StepSpec(
                step["ref"],
                step["task"],
                str(spec["module"]),
                float(spec["timeout_s"]),
                int(spec["retries"]),
                float(spec["retry_backoff_s"]),
                step.get("params") or {},
            )
        )
    given = claimed.input
    image = str(given.get("image") or "")
    data = given.get("data")
    run = RunState(
        claimed.id,
        claimed.policy,
        claimed.data_plane if image else DataPlane.NONE,  # no image: nothing to move
        steps,
        image,
        data=data if isinstance(data, dict) else {},
        result_format=_format(given.get("result_format")),
        intermediate_format=_format(given.get("intermediate_format")),
        current_uri=image,
    )
    # A run that was placed before goes on from its last attempts, under fresh object keys.
    return run.again(claimed.attempts) if claimed.attempts else run


def _format(given: Any) -> str:
    """A stored input's image format; the API admits only known ones, and one it no longer
    knows (a row written by a later version) falls back to lossless PNG."""
    name = str(given or "png")
    return name if name in imagebuf.RESULT_FORMATS else "png"


def _ordered(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Steps in an order that respects ``depends_on`` (they run one after another)."""
    done: set[str] = set()
    ordered: list[dict[str, Any]] = []
    pending = list(steps)
    while pending:
        ready = [s for s in pending if set(s.get("depends_on") or []) <= done]
        if not ready:
            raise OrchestratorError("the workflow definition has a dependency cycle")
        for step in ready:
            ordered.append(step)
            done.add(step["ref"])
            pending.remove(step)
    return ordered
