"""Which workflows this scheduler runs: PENDING ones it claims, and its own RUNNING ones that no
run in memory stands for (after a restart, a resync with Postgres, or a take-over from a dead
scheduler), which start over from their input (their CDI objects are gone or not trusted),
every step's attempts going on from the last one Postgres has (``Claimed.attempts``).

Several schedulers may run: a claim takes rows with ``SKIP LOCKED`` (``run_statements.CLAIM``),
so none is claimed twice, and takes at most ``CLAIM_BATCH`` while fewer than
``max_active_workflows`` are this scheduler's. A claimed workflow becomes a ``RunState``
(``plan``: its graph, sub-workflows inlined at their current versions); one that cannot run
(its definition or a task gone, a sub-workflow missing) fails with the reason.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Final

from orchestrator.contract.vocabulary import DataPlane, WorkflowStatus
from orchestrator.db.run_statements import Claimed, Finish
from orchestrator.errors import OrchestratorError
from orchestrator.scheduler import progress
from orchestrator.scheduler.context import SchedulerContext
from orchestrator.scheduler.dispatch import Dispatcher
from orchestrator.scheduler.endings import Endings, ended_rows
from orchestrator.scheduler.guarded import guarded
from orchestrator.scheduler.instructions import RELEASE_TASK
from orchestrator.scheduler.planes import PLANES
from orchestrator.scheduler.runs import (
    DEFAULT_MAX_PARALLEL,
    RunState,
    StepSpec,
    fresh_key_prefix,
)
from orchestrator.settings import Settings
from workflows import imagebuf
from workflows.binding import IMAGE
from workflows.errors import InvalidDefinition
from workflows.graph import Graph, Node, build_graph
from workflows.steps import INPUT, DataRef

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
        # Some definition has a concurrency limit: claims count (``SchedulerStore.claim``).
        # Learnt by ``check_limits``; while it is unknown the plain claim leaves limited
        # definitions' runs alone, so a stale value never lets a limit be passed.
        self.limits = False

    def check_limits(self) -> None:
        """Learn again whether any definition has a concurrency limit."""
        self.limits = self.ctx.db.limits_exist()

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
        claims = self.ctx.db.claim(self.ctx.id, want, RECLAIM_AFTER_S, limits=self.limits)
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
                run = plan(claimed, self.ctx.db.definitions, self.settings.max_parallel_tasks)
            except OrchestratorError as exc:
                failed = Finish(claimed.id, WorkflowStatus.FAILED, error=str(exc))
                self.endings.ended(claimed.id, self.ctx.db.finish(failed))
                continue
            self.ctx.runs[run.workflow_id] = run
            if run.deadline is not None:
                self.ctx.tick.by(run.deadline)  # it times out at its deadline's tick
            guarded(lambda run=run: self.start(run), self.ctx.faults)  # type: ignore[misc]

    def start(self, run: RunState, delay: float = 0.0) -> None:
        """Start a run at its first steps (after ``delay`` seconds: the tick places them)."""
        moves = progress.settle(run)
        if moves.failure:
            self.endings.fail(run, moves.failure)
            return
        for step in moves.ready:
            step.retry_at = time.monotonic() + delay if delay else 0.0
        placed = self.dispatch.place(run, moves.ready) if not delay else []
        self.ctx.db.place([*placed, *ended_rows(self.ctx.db, run, moves)])
        self.endings.free(run, moves.freed)


def plan(
    claimed: Claimed,
    subs: Callable[[set[str]], tuple[dict[str, list[dict[str, Any]]], dict[str, dict[str, Any]]]],
    max_parallel: int = DEFAULT_MAX_PARALLEL,
) -> RunState:
    """The in-memory run of a claimed workflow; ``OrchestratorError`` if it cannot run.
    ``subs(names)`` gives the current steps of other definitions and the tasks they name (for
    sub-workflow steps)."""
    if claimed.steps is None:
        raise OrchestratorError(f"workflow definition {claimed.definition!r} is gone")
    definitions: dict[str, list[dict[str, Any]]] = {}
    task_defs = dict(claimed.task_defs)
    wanted = _sub_names(claimed.steps)
    while wanted - set(definitions):
        found, tasks = subs(wanted - set(definitions))
        missing = wanted - set(definitions) - set(found)
        definitions.update(found)
        definitions.update({name: [] for name in missing})  # reported by ``build_graph``
        task_defs.update(tasks)
        wanted |= {n for steps in found.values() for n in _sub_names(steps)}
    try:
        graph = build_graph(claimed.steps, lambda name: definitions.get(name) or None)
    except (InvalidDefinition, ValueError) as exc:
        raise OrchestratorError(
            f"workflow definition {claimed.definition!r} cannot run: {exc}"
        ) from None
    graph = with_input_fetch(graph)
    given = claimed.input
    image = str(given.get("image") or "")
    plane = claimed.data_plane if image else DataPlane.NONE  # no image: nothing to fetch
    problem = PLANES[plane].problem(graph)
    if problem is not None:
        raise OrchestratorError(f"workflow definition {claimed.definition!r} {problem}")
    specs = {}
    for ref, node in graph.nodes.items():
        if node.task is None:
            continue
        spec = FETCH_TASK if ref == INPUT else task_defs.get(node.task)
        if spec is None:
            raise OrchestratorError(f"task {node.task!r} of step {ref!r} is gone")
        specs[ref] = StepSpec(
            ref,
            node.task,
            str(spec["module"]),
            float(spec["timeout_s"]),
            int(spec["retries"]),
            float(spec["retry_backoff_s"]),
            dict(node.params),
            max_concurrency=int(spec.get("max_concurrency") or 0),
        )
    data = given.get("data")
    run = RunState(
        claimed.id,
        claimed.policy,
        plane,
        graph,
        specs,
        image,
        data=data if isinstance(data, dict) else {},
        result_format=_format(given.get("result_format")),
        intermediate_format=_format(given.get("intermediate_format")),
        max_parallel=max_parallel,
        priority=claimed.priority,
        paused=claimed.paused,
        timeout_s=claimed.timeout_s,
        deadline=_deadline(claimed),
        worker_wait_s=claimed.worker_wait_s,
        key_prefix=fresh_key_prefix(claimed.id),
    )
    # A run that was placed before goes on from its last attempts.
    return run.again(claimed.attempts) if claimed.attempts else run


def _deadline(claimed: Claimed) -> float | None:
    """When (monotonic) a claimed run passes its time limit, counted from its first start (a
    run resumed after a restart keeps its deadline)."""
    if claimed.timeout_s is None:
        return None
    started = claimed.started_at if claimed.started_at is not None else time.time()
    return time.monotonic() + started + claimed.timeout_s - time.time()


def _format(given: Any) -> str:
    """A stored input's image format; the API admits only known ones, and one it no longer
    knows (a row written by a later version) falls back to lossless PNG."""
    name = str(given or "png")
    return name if name in imagebuf.RESULT_FORMATS else "png"


def _sub_names(steps: list[dict[str, Any]]) -> set[str]:
    return {str(s["workflow"]) for s in steps if s.get("workflow") is not None}


# The step that fetches the run's input image when several steps read it (``with_input_fetch``):
# the worker makes the object from S3, runs a no-op on it and hands it back to be shared.
FETCH_TASK: Final[dict[str, Any]] = {
    "module": RELEASE_TASK, "timeout_s": 60.0, "retries": 2, "retry_backoff_s": 0.5,
}  # fmt: skip


def with_input_fetch(graph: Graph) -> Graph:
    """``graph`` with a step of its own that fetches the input image (ref ``input``) when the
    image is read other than by one step as its ``image`` (the single reader fetches it
    itself, as the first step of a chain does)."""
    want = DataRef(INPUT, IMAGE)
    reads = [(n, name) for n in graph.nodes.values() for name, alts in n.inputs.items()
             if want in alts]  # fmt: skip
    if not reads:
        return graph
    node, name = reads[0]
    if len(reads) == 1 and name == IMAGE and node.for_each is None and len(node.inputs[name]) == 1:
        return graph
    fetch = Node(INPUT, INPUT, inputs={IMAGE: (want,)}, chain=True)
    nodes = {INPUT: fetch}
    for ref, n in graph.nodes.items():
        reads_input = any(want in alts for alts in n.inputs.values())
        nodes[ref] = replace(n, after=n.after | {INPUT}) if reads_input else n
    return Graph(nodes)
