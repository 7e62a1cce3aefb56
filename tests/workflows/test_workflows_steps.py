"""Definitions with named inputs, switches, fan-out and sub-workflows: what validation says."""

from __future__ import annotations

from typing import Any

import pytest

from workflows.definitions import Step, validate_workflow
from workflows.graph import build_graph
from workflows.steps import STEP_KEYS, STEP_KINDS, DataRef, StepKind, parse_ref

KNOWN = ["deblur", "denoise", "classify", "noop", "sleep"]


def problems_of(*steps: dict[str, Any], workflows: list[str] | None = None) -> list[str]:
    defn = {"name": "wf", "description": "", "tasks": list(steps)}
    return validate_workflow(defn, KNOWN, workflows)


def test_every_step_kind_has_its_rule_and_its_fields() -> None:
    assert set(STEP_KINDS) == set(StepKind)
    owned = {f for rule in STEP_KINDS.values() for f in rule.fields}
    assert set(StepKind) | owned <= STEP_KEYS


def test_a_data_reference_is_ref_dot_output() -> None:
    assert parse_ref("split.tiles") == DataRef("split", "tiles")
    assert str(parse_ref("input.image")) == "input.image"
    for bad in ("split", "a.b.c", "1a.x", "a.", ".x", 3, None):
        assert parse_ref(bad) is None


def test_a_diamond_with_named_inputs_is_valid() -> None:
    steps: list[dict[str, Any]] = [
        {"ref": "a", "task": "deblur"},
        {"ref": "b1", "task": "denoise", "depends_on": ["a"]},
        {"ref": "b2", "task": "classify", "inputs": {"image": "a.image"}},
        {"ref": "c", "task": "noop", "inputs": {"left": "b1.image", "label": "b2.label"}},
    ]
    assert problems_of(*steps) == []


def test_a_join_that_names_no_inputs_is_told_how() -> None:
    [problem] = problems_of(
        {"ref": "a", "task": "noop"},
        {"ref": "b", "task": "noop"},
        {"ref": "c", "task": "noop", "depends_on": ["a", "b"]},
    )
    assert "depends on 2 steps ('a', 'b') and names no 'inputs'" in problem
    assert '"inputs": {"a": "a.image", "b": "b.image"}' in problem


@pytest.mark.parametrize(
    ("step", "fragment"),
    [
        ({"ref": "b", "task": "noop", "inputs": {"x": "ghost.image"}}, "no step 'ghost'"),
        ({"ref": "b", "task": "noop", "inputs": {"x": "a"}}, 'is not "<ref>.<output>"'),
        ({"ref": "b", "task": "noop", "inputs": {"x": []}}, "lists no data"),
        ({"ref": "b", "task": "noop", "inputs": {"not valid": "a.image"}}, "not a Python"),
        ({"ref": "b", "task": "noop", "inputs": {"class": "a.image"}}, "not a Python"),
        ({"ref": "b", "task": "noop", "inputs": ["a.image"]}, "'inputs' must be an object"),
        ({"ref": "b", "task": "noop", "inputs": {"x": "b.image"}}, "reads its own output"),
        ({"ref": "b", "task": "noop", "for_each": "x"}, "'for_each' must name one of"),
        ({"ref": "b", "task": "noop", "inputs": {"x": "a.t"}, "for_each": "y"}, "'for_each'"),
        ({"ref": "input", "task": "noop"}, "may not be called 'input'"),
        ({"ref": "b"}, "missing 'task' (or 'switch', or 'workflow')"),
        ({"ref": "b", "task": "noop", "workflow": "w"}, "not several"),
        ({"ref": "b", "switch": "a.label", "cases": {"x": ["a"]}, "params": {"k": 1}}, "'params'"),
        ({"ref": "b", "task": "noop", "default": ["a"]}, "'default' belongs to switch"),
    ],
)
def test_each_problem_of_a_step(step: dict[str, Any], fragment: str) -> None:
    found = problems_of({"ref": "a", "task": "noop"}, step)
    assert any(fragment in p for p in found), found


def test_a_switch_and_its_cases() -> None:
    steps: list[dict[str, Any]] = [
        {"ref": "classify", "task": "classify"},
        {"ref": "route", "switch": "classify.label", "cases": {"dark": ["brighten"]},
         "default": ["keep"]},
        {"ref": "brighten", "task": "denoise", "depends_on": ["classify"]},
        {"ref": "keep", "task": "noop", "depends_on": ["classify"]},
        {"ref": "out", "task": "noop", "inputs": {"image": ["brighten.image", "keep.image"]}},
    ]  # fmt: skip
    assert problems_of(*steps) == []
    parsed = [Step.from_dict(s) for s in steps]
    assert parsed[1] == Step(
        "route", switch="classify.label", cases={"dark": ["brighten"]}, default=("keep",)
    )
    assert [s.to_dict() for s in parsed] == steps


@pytest.mark.parametrize(
    ("switch", "fragment"),
    [
        ({"switch": "a"}, "'switch' must be"),
        ({"switch": "a.label"}, "needs 'cases'"),
        ({"switch": "a.label", "cases": {"x": "b"}}, "'cases' must be an object"),
        ({"switch": "a.label", "cases": {"x": ["ghost"]}}, "unknown step 'ghost'"),
        ({"switch": "a.label", "cases": {"x": ["s"]}}, "lists itself"),
        ({"switch": "a.label", "default": "b"}, "'default' must be a list"),
        ({"switch": "a.label", "default": ["a"]}, "dependency cycle"),
        ({"switch": "a.label", "default": ["b"], "inputs": {"x": "a.image"}}, "not 'inputs'"),
    ],
)
def test_each_problem_of_a_switch(switch: dict[str, Any], fragment: str) -> None:
    found = problems_of(
        {"ref": "a", "task": "classify"},
        {"ref": "s", **switch},
        {"ref": "b", "task": "noop", "depends_on": ["a"]},
    )
    assert any(fragment in p for p in found), found


def test_nothing_reads_a_switch_and_nothing_reads_its_image_by_default() -> None:
    found = problems_of(
        {"ref": "a", "task": "classify"},
        {"ref": "s", "switch": "a.label", "default": ["b", "c"]},
        {"ref": "b", "task": "noop", "depends_on": ["s"]},
        {"ref": "c", "task": "noop", "inputs": {"x": "s.value"}},
    )
    assert any("depends only on switch 's'" in p for p in found), found
    assert any("switch 's' has no outputs" in p for p in found), found


def test_a_sub_workflow_must_be_known_and_not_itself() -> None:
    sub = {"ref": "enhance", "workflow": "image_pipeline", "inputs": {"image": "input.image"}}
    assert problems_of(sub, workflows=["image_pipeline"]) == []
    assert any("unknown workflow 'image_pipelin'" in p for p in problems_of(
        {**sub, "workflow": "image_pipelin"}, workflows=["image_pipeline"]
    ))  # fmt: skip
    assert any("may not run itself" in p for p in problems_of({**sub, "workflow": "wf"}))
    # Without the known workflows (the scheduler's check of a stored definition) any name goes.
    assert problems_of({**sub, "workflow": "elsewhere"}) == []


def test_cycles_through_inputs_and_cases_are_found() -> None:
    found = problems_of(
        {"ref": "a", "task": "noop", "inputs": {"x": "b.image"}},
        {"ref": "b", "task": "noop", "inputs": {"x": "a.image"}},
    )
    assert any(p.startswith("dependency cycle: a -> b -> a") for p in found), found


def test_streaming_steps_joined_by_channels_are_valid_and_form_one_group() -> None:
    steps = [
        {"ref": "src", "task": "noop", "channels": {"publish": ["frames"]}},
        {"ref": "mid", "task": "noop", "channels": {"subscribe": ["frames"], "publish": ["out"]}},
        {"ref": "sink", "task": "noop", "channels": {"subscribe": ["out"]}},
        {"ref": "after", "task": "noop", "inputs": {"x": "sink.total"}},  # waits for the group
    ]
    assert problems_of(*steps) == []
    graph = build_graph(steps, lambda name: None)
    assert graph.stream_groups["mid"] == ("src", "mid", "sink")
    assert "after" not in graph.stream_groups
    assert graph.channel_plan("mid") == {
        "publish": {"out": ["sink"]},
        "subscribe": {"frames": "src"},
    }
    assert graph.channel_plan("after") == {}


@pytest.mark.parametrize(
    ("steps", "fragment"),
    [
        ([{"ref": "a", "task": "noop", "channels": {"publish": ["c"]}}],
         "channel 'c': step 'a' publishes it, but no step subscribes to it"),
        ([{"ref": "a", "task": "noop", "channels": {"subscribe": ["c"]}}],
         "no step publishes it"),
        ([{"ref": "a", "task": "noop", "channels": {"publish": ["c"]}},
          {"ref": "b", "task": "noop", "channels": {"publish": ["c"]}},
          {"ref": "r", "task": "noop", "channels": {"subscribe": ["c"]}}],
         "a channel has one publisher"),
        ([{"ref": "a", "task": "noop", "channels": {"publish": ["c"]}},
          {"ref": "b", "task": "noop", "channels": {"subscribe": ["c"]}, "depends_on": ["a"]}],
         "step 'b': waits for 'a' to end, but the steps of a streaming group"),
        ([{"ref": "a", "task": "noop", "channels": {"publish": ["c"], "subscribe": ["c"]}}],
         "does not subscribe to its own channel"),
        ([{"ref": "a", "task": "noop", "channels": {"send": ["c"]}}], "unknown field 'send'"),
        ([{"ref": "a", "task": "noop", "channels": ["c"]}], "'channels' must be an object"),
        ([{"ref": "a", "task": "noop", "channels": {"publish": ["no way"]}}],
         "channel name 'no way' is not valid"),
        ([{"ref": "s", "switch": "a.x", "default": ["a"], "channels": {"publish": ["c"]}},
          {"ref": "a", "task": "noop"}],
         "'channels' belongs to task steps"),
    ],
)  # fmt: skip
def test_each_problem_of_a_streaming_step(steps: list[dict[str, Any]], fragment: str) -> None:
    found = problems_of(*steps)
    assert any(fragment in p for p in found), found
