"""Which steps of a graph hand what they make straight to the one step that reads it, and the
worker a join is bound to by the first of its inputs sent (pure, no services)."""

from __future__ import annotations

import uuid
from typing import Any

import msgspec

from cdi import ObjectKey
from orchestrator.contract.messages import Instruction
from orchestrator.contract.vocabulary import DataPlane, Policy
from orchestrator.scheduler import progress
from orchestrator.scheduler.claims import with_input_fetch
from orchestrator.scheduler.data import Datum, Obj
from orchestrator.scheduler.instructions import sole_reader
from orchestrator.scheduler.join_binding import bound_worker
from orchestrator.scheduler.runs import InFlight, RunState, StepSpec
from workflows.graph import build_graph
from workflows.kinds import Kind

SCHEDULER = "scheduler-1"
DIAMOND: list[dict[str, Any]] = [
    {"ref": "a", "task": "deblur"},
    {"ref": "b1", "task": "nap_blur", "inputs": {"image": "a.image"}},
    {"ref": "b2", "task": "measure", "inputs": {"image": "a.image"}},
    {"ref": "c", "task": "combine", "inputs": {"blurred": "b1.image", "hist": "b2.hist"}},
]


def _run(steps: list[dict[str, Any]]) -> RunState:
    graph = with_input_fetch(build_graph(steps, lambda name: None))
    specs = {r: StepSpec(r, n.task, f"m:{n.task}", 30.0, 2, 0.1)
             for r, n in graph.nodes.items() if n.task}  # fmt: skip
    return RunState(uuid.uuid4(), Policy.TRANSFER, DataPlane.CDI, graph, specs, "s3://b/in.jpg")


def _readers(run: RunState) -> dict[str, str | None]:
    return {ref: sole_reader(run, step) for ref, step in run.steps.items()}


def _diamond_branches() -> RunState:
    """The diamond with ``a`` done: both branches ready."""
    run = _run(DIAMOND)
    progress.settle(run)
    run.objects[ObjectKey("k1")] = Obj(ObjectKey("k1"), Kind.IMAGE, 100, SCHEDULER)
    made = {"image": Datum(key=ObjectKey("k1"), kind=Kind.IMAGE)}
    progress.done(run, run.steps["a"], made, {})
    return run


def test_a_join_input_hands_on_and_a_fork_or_a_sink_does_not() -> None:
    run = _diamond_branches()
    assert _readers(run) == {"a": None, "b1": "c", "b2": "c", "c": None}


def test_a_case_hands_on_to_the_join_after_its_switch_but_not_into_a_case() -> None:
    run = _run([
        {"ref": "label", "task": "classify"},
        {"ref": "route", "switch": "label.label", "cases": {"dark": ["brighten"]},
         "default": ["keep"]},
        {"ref": "pre", "task": "deblur", "depends_on": ["label"],
         "inputs": {"image": "label.image"}},
        {"ref": "brighten", "task": "nap_blur", "inputs": {"image": "pre.image"}},
        {"ref": "keep", "task": "deblur", "inputs": {"image": "label.image"}},
        {"ref": "out", "task": "denoise", "inputs": {"image": ["brighten.image", "keep.image"]}},
    ])  # fmt: skip
    progress.settle(run)
    steps = {ref: run.steps.get(ref) for ref in ("pre", "brighten", "keep")}
    got = {ref: sole_reader(run, s) if s is not None else "?" for ref, s in steps.items()}
    # ``pre``'s only reader is in a case (it may be skipped): its image comes back.
    assert got == {"pre": None, "brighten": "out", "keep": "out"}


def test_the_first_input_sent_binds_the_join_and_an_object_handed_on_keeps_it_bound() -> None:
    run = _diamond_branches()
    assert bound_worker(SCHEDULER, run, "c") is None
    b1 = run.steps["b1"]
    sent = Instruction(task_run_id=1, workflow_id=str(run.workflow_id), ref="b1", task="m:x",
                       attempt=1, timeout_s=30, reply_to="r", data_plane=DataPlane.CDI,
                       queued_at=0.0, hand_to="worker-2")  # fmt: skip
    b1.in_flight = InFlight(sent, "worker-1", worker_started=0.0, deadline=0.0)
    assert bound_worker(SCHEDULER, run, "c") == "worker-2"
    kept = msgspec.structs.replace(sent, hand_to="", keep=True)
    b1.in_flight = InFlight(kept, "worker-1", worker_started=0.0, deadline=0.0)
    assert bound_worker(SCHEDULER, run, "c") == "worker-1"  # kept where it runs
    b1.in_flight = None
    run.objects[ObjectKey("k2")] = Obj(ObjectKey("k2"), Kind.IMAGE, 100, "worker-3",
                                       datum="b1.image")  # fmt: skip
    assert bound_worker(SCHEDULER, run, "c") == "worker-3"  # handed on, the report read
    run.objects[ObjectKey("k2")].owner = SCHEDULER  # back with the scheduler (b1 failed)
    assert bound_worker(SCHEDULER, run, "c") is None
