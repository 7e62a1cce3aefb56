"""The scheduler's bookkeeping of a run's graph (pure, no services): which steps start when,
switches and skips, fan-out, each object's reads to come, and held images lost and redone."""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Any

from cdi import ObjectKey
from orchestrator.contract.keys import workflow_of_object
from orchestrator.contract.vocabulary import DataPlane, Policy
from orchestrator.db.run_statements import Claimed
from orchestrator.scheduler import progress
from orchestrator.scheduler.claims import plan, with_input_fetch
from orchestrator.scheduler.data import Datum, Mode, Obj
from orchestrator.scheduler.runs import Phase, RunState, StepSpec
from workflows.graph import build_graph
from workflows.kinds import Kind


def _run(*steps: dict[str, Any], image: str = "s3://b/in.jpg") -> RunState:
    graph = with_input_fetch(build_graph(list(steps), lambda name: None))
    specs = {r: StepSpec(r, n.task, f"m:{n.task}", 30.0, 2, 0.1)
             for r, n in graph.nodes.items() if n.task}  # fmt: skip
    return RunState(uuid.uuid4(), Policy.TRANSFER, DataPlane.CDI, graph, specs, image)


def _image(run: RunState, key: str, owner: str = "sched") -> dict[str, Datum]:
    run.objects[ObjectKey(key)] = Obj(ObjectKey(key), Kind.IMAGE, 100, owner)
    return {"image": Datum(key=ObjectKey(key), kind=Kind.IMAGE)}


def test_a_diamond_starts_both_branches_and_joins_both_inputs() -> None:
    run = _run(
        {"ref": "a", "task": "deblur"},
        {"ref": "b1", "task": "denoise", "depends_on": ["a"]},
        {"ref": "b2", "task": "classify", "inputs": {"image": "a.image"}},
        {"ref": "c", "task": "noop", "inputs": {"left": "b1.image", "label": "b2.label"}},
    )
    assert [s.id for s in progress.settle(run).ready] == ["a"]
    assert run.steps["a"].reads["image"].uri == "s3://b/in.jpg"  # its worker fetches the input
    moves = progress.done(run, run.steps["a"], _image(run, "k1"), {})
    assert [s.id for s in moves.ready] == ["b1", "b2"]
    assert run.objects[ObjectKey("k1")].pending == 2  # two reads to come: both get a share
    assert run.objects[ObjectKey("k1")].mode_for() is Mode.READ
    moves = progress.done(run, run.steps["b1"], _image(run, "k2"), {})
    assert moves.ready == []  # c waits for b2 too
    moves = progress.done(run, run.steps["b2"], {}, {"label": "blue"})
    progress.read_done(run, ObjectKey("k1"), "w1", moves)
    progress.read_done(run, ObjectKey("k1"), "w2", moves)
    [c] = moves.ready
    assert c.reads == {
        "left": Datum(key=ObjectKey("k2"), kind=Kind.IMAGE),
        "label": Datum(value="blue"),
    }
    assert [o.key for o in moves.freed] == ["k1"]  # nothing reads a's image any more
    # The last read takes the object itself.
    assert run.objects[ObjectKey("k2")].mode_for() is Mode.OWN


def test_a_switch_runs_one_case_and_skips_the_other_and_what_only_follows_it() -> None:
    def route(label: str) -> tuple[list[str], list[str], dict[str, Any]]:
        run = _run(
            {"ref": "classify", "task": "classify"},
            {"ref": "route", "switch": "classify.label", "cases": {"dark": ["brighten"]},
             "default": ["keep"]},
            {"ref": "brighten", "task": "denoise", "depends_on": ["classify"]},
            {"ref": "keep", "task": "noop", "depends_on": ["classify"]},
            {"ref": "after_keep", "task": "noop", "depends_on": ["keep"]},
            {"ref": "out", "task": "noop", "inputs": {"image": ["brighten.image", "keep.image"]}},
        )  # fmt: skip
        progress.settle(run)
        moves = progress.done(run, run.steps["classify"], _image(run, "k1"), {"label": label})
        [(switch, said)] = moves.switched
        assert switch.id == "route"
        return [s.id for s in moves.ready], [s.id for s in moves.skipped], said

    ready, skipped, said = route("dark")
    assert (ready, skipped) == (["brighten"], ["keep", "after_keep"])
    assert said == {"value": "dark", "case": "dark", "runs": ["brighten"]}
    ready, skipped, said = route("blue")
    assert (ready, skipped) == (["keep"], ["brighten"])
    assert said["case"] is None  # the default


def test_a_fan_out_runs_once_per_element_and_the_join_gets_them_in_order() -> None:
    run = _run(
        {"ref": "split", "task": "noop"},
        {"ref": "blur", "task": "denoise", "inputs": {"tile": "split.tiles", "k": "split.k"},
         "for_each": "tile"},
        {"ref": "join", "task": "noop", "inputs": {"tiles": "blur.image"}},
    )  # fmt: skip
    progress.settle(run)
    tiles = []
    for i in range(3):
        run.objects[ObjectKey(f"t{i}")] = Obj(ObjectKey(f"t{i}"), Kind.IMAGE, 10, "sched")
        tiles.append(Datum(key=ObjectKey(f"t{i}"), kind=Kind.IMAGE))
    made = {"tiles": Datum(items=tuple(tiles))}
    moves = progress.done(run, run.steps["split"], made, {"k": 3})
    assert [s.id for s in moves.ready] == ["blur[0]", "blur[1]", "blur[2]"]
    assert moves.ready[1].reads == {"tile": tiles[1], "k": Datum(value=3)}
    assert run.steps["blur"].phase is Phase.FANNED
    for i in (2, 0, 1):  # they end in any order
        moves = progress.done(run, run.steps[f"blur[{i}]"], _image(run, f"b{i}"), {})
    [join] = moves.ready
    assert [d.key for d in join.reads["tiles"].items or ()] == ["b0", "b1", "b2"]


def test_a_fan_out_over_nothing_ends_at_once() -> None:
    run = _run(
        {"ref": "split", "task": "noop"},
        {"ref": "each", "task": "noop", "inputs": {"x": "split.items"}, "for_each": "x"},
        {"ref": "join", "task": "noop", "inputs": {"all": "each.y"}},
    )
    progress.settle(run)
    moves = progress.done(run, run.steps["split"], {}, {"items": []})
    assert [s.id for s in moves.ready] == ["join"]
    assert moves.ready[0].reads == {"all": Datum(items=())}


def test_an_output_no_step_made_fails_the_run_with_both_names() -> None:
    run = _run(
        {"ref": "a", "task": "noop"}, {"ref": "b", "task": "noop", "inputs": {"m": "a.mask"}}
    )
    progress.settle(run)
    moves = progress.done(run, run.steps["a"], {}, {"label": "x"})
    assert "step 'b' reads a.mask" in moves.failure and "they made: label" in moves.failure


def test_the_input_image_read_by_two_steps_is_fetched_once_by_a_step_of_its_own() -> None:
    run = _run(
        {"ref": "left", "task": "deblur"},
        {"ref": "right", "task": "denoise"},
    )
    assert [s.id for s in progress.settle(run).ready] == ["input"]
    moves = progress.done(run, run.steps["input"], _image(run, "k0"), {})
    assert [s.id for s in moves.ready] == ["left", "right"]
    assert run.objects[ObjectKey("k0")].pending == 2


def test_a_chain_without_an_image_reads_none() -> None:
    run = _run({"ref": "a", "task": "noop"}, {"ref": "b", "task": "noop", "depends_on": ["a"]},
               image="")  # fmt: skip
    [a] = progress.settle(run).ready
    assert a.reads == {}
    [b] = progress.done(run, a, {}, {"n": 1}).ready
    assert b.reads == {}


def test_a_lost_held_image_rewinds_the_steps_that_made_it() -> None:
    run = _run(
        {"ref": "a", "task": "deblur"},
        {"ref": "b", "task": "denoise", "depends_on": ["a"]},
        {"ref": "c", "task": "denoise", "depends_on": ["b"]},
        {"ref": "d", "task": "classify", "depends_on": ["c"]},
    )
    progress.settle(run)
    progress.done(run, run.steps["a"], _image(run, "k1", owner="w"), {})  # a's image written
    run.attempts.update(a=1, b=1, c=1)
    base = run.objects[ObjectKey("k1")]
    base.held, base.held_chain, base.held_base = "7", ("b", "c"), ("a", "image")
    for ref in ("b", "c"):  # they held their images over k1
        run.steps[ref].phase = Phase.DONE
    reader = run.steps["d"]  # it was reading c's held image when the worker died
    reader.attempt = run.attempts["d"] = 1
    again = progress.rewind(run, base, reader=reader)
    assert [s.id for s in again] == ["b", "c"] and [s.attempt for s in again] == [2, 2]
    assert [s.lost for s in again] == [1, 1]  # lost with the worker: no retry spent
    assert (reader.phase, reader.attempt, reader.lost) == (Phase.WAITING, 2, 1)
    assert (base.held, base.pending) == ("", 1)
    [b] = progress.settle(run).ready
    assert b.id == "b" and b.reads == {"image": Datum(key=ObjectKey("k1"), kind=Kind.IMAGE)}


def test_each_claim_of_a_workflow_names_its_objects_apart() -> None:
    """A run never placed (no attempt in Postgres) may still have had its first instruction
    sent by a scheduler killed before its turn committed: a new claim must not name objects as
    that drive did (a worker may hold, or be making, one of them)."""
    steps: list[dict[str, Any]] = [
        {"ref": "a", "task": "deblur"},
        {"ref": "b", "task": "denoise", "depends_on": ["a"]},
    ]
    tasks = {name: {"module": f"m:{name}", "timeout_s": 30.0, "retries": 2,
                    "retry_backoff_s": 0.1} for name in ("deblur", "denoise")}  # fmt: skip
    claimed = Claimed(uuid.uuid4(), "d", {"image": "s3://b/in.jpg"}, Policy.TRANSFER,
                      DataPlane.CDI, steps, tasks)  # fmt: skip
    first, second = (plan(claimed, lambda names: ({}, {})) for _ in range(2))
    keys = [first.next_object_key(), first.next_object_key(), second.next_object_key()]
    assert len(set(keys)) == 3, keys
    assert {workflow_of_object(k) for k in keys} == {claimed.id}  # still the run's, to sweep
    assert (first.drives, second.drives) == (1, 1)  # a claim is no drive again
    # Placed before: it goes on from its attempts, under keys of its own too.
    resumed = plan(replace(claimed, attempts={"a": 1}), lambda names: ({}, {}))
    assert resumed.next_object_key() not in keys and resumed.attempts == {"a": 1}
