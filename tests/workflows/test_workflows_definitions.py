"""Workflow and task definitions: the bundled ones, and every validation error."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from workflows.definitions import (
    IMAGE_PIPELINE,
    NOOP_PIPELINE,
    Step,
    WorkflowDefinition,
    bundled_task_definitions,
    bundled_workflows,
    chain_problems,
    parse_task_definition,
    parse_workflow,
    task_definition_problems,
    validate_workflow,
)
from workflows.errors import InvalidDefinition

KNOWN = ["deblur", "denoise", "classify", "noop", "sleep"]


def workflow(*steps: dict[str, Any], name: str = "wf") -> dict[str, Any]:
    return {"name": name, "description": "test", "tasks": list(steps)}


def one_problem(defn: Any) -> str:
    problems = validate_workflow(defn, KNOWN)
    assert len(problems) == 1, problems
    return problems[0]


# --- bundled -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["image_pipeline", "fork_join_pipeline", "noop_pipeline"])
def test_bundled_workflows_are_valid(name: str) -> None:
    defn = bundled_workflows()[name]
    known = [t["name"] for t in bundled_task_definitions()]
    assert validate_workflow(defn, known) == []
    parsed = parse_workflow(defn, known)
    assert parsed.to_dict() == defn  # the dataclass round-trips to the JSON shape


def test_image_pipeline_shape_and_order() -> None:
    parsed = parse_workflow(IMAGE_PIPELINE, KNOWN)
    assert parsed.order() == ["deblur", "denoise", "classify"]
    assert parsed.tasks[1] == Step("denoise", "denoise", ("deblur",))
    assert [s.task for s in parse_workflow(NOOP_PIPELINE, KNOWN).tasks] == ["noop"] * 3


def test_bundled_copies_are_independent() -> None:
    bundled_workflows()["image_pipeline"]["tasks"].clear()
    bundled_task_definitions()[0]["retries"] = 99
    assert len(IMAGE_PIPELINE["tasks"]) == 3
    assert bundled_task_definitions()[0]["retries"] == 2


def test_bundled_task_definitions_are_valid() -> None:
    for d in bundled_task_definitions():
        assert parse_task_definition(d).to_dict() == d


def test_order_of_a_diamond() -> None:
    steps = (
        Step("d", "noop", ("b", "c")),
        Step("b", "noop", ("a",)),
        Step("c", "noop", ("a",)),
        Step("a", "noop"),
    )
    order = WorkflowDefinition("diamond", "", steps).order()
    assert order.index("a") < order.index("b") < order.index("d")
    assert order.index("c") < order.index("d")


@pytest.mark.parametrize(
    ("steps", "said"),
    [
        # a fork: two steps read the same step's output
        ([{"ref": "a", "task": "noop"}, {"ref": "b1", "task": "noop", "depends_on": ["a"]},
          {"ref": "b2", "task": "noop", "depends_on": ["a"]}],
         "steps 'b1', 'b2' all depend on step 'a'"),
        # a join: one step reads two
        ([{"ref": "a", "task": "noop"}, {"ref": "b", "task": "noop"},
          {"ref": "c", "task": "noop", "depends_on": ["a", "b"],
           "inputs": {"left": "a.image", "right": "b.image"}}],
         "step 'c': 'inputs' needs the cdi plane"),
        # two independent starts
        ([{"ref": "a", "task": "noop"}, {"ref": "b", "task": "noop"}],
         "steps 'a', 'b' all start the workflow"),
    ],
)  # fmt: skip
def test_forks_and_joins_are_accepted_but_are_not_one_chain(
    steps: list[dict[str, Any]], said: str
) -> None:
    assert validate_workflow(workflow(*steps), KNOWN) == []
    problems = chain_problems(steps)  # what the object-store plane refuses
    assert any(said in p and "cdi plane" in p for p in problems), problems


def test_a_chain_in_any_order_is_accepted() -> None:
    steps: list[dict[str, Any]] = [
        {"ref": "c", "task": "noop", "depends_on": ["b"]},
        {"ref": "a", "task": "noop"},
        {"ref": "b", "task": "noop", "depends_on": ["a"]},
    ]
    assert validate_workflow(workflow(*steps), KNOWN) == []
    assert chain_problems(steps) == []


def test_params_reach_the_parsed_step() -> None:
    parsed = parse_workflow(workflow({"ref": "s", "task": "sleep", "params": {"ms": 5}}), KNOWN)
    assert parsed.tasks[0].params == {"ms": 5}


# --- each validation error -------------------------------------------------------------------


def test_unknown_task_suggests_a_close_name() -> None:
    problem = one_problem(workflow({"ref": "a", "task": "deblurr"}))
    assert "unknown task 'deblurr'" in problem and "did you mean 'deblur'" in problem


def test_duplicate_ref() -> None:
    problem = one_problem(workflow({"ref": "a", "task": "noop"}, {"ref": "a", "task": "noop"}))
    assert "tasks[1]: duplicate ref 'a'" in problem


def test_unknown_dependency() -> None:
    problem = one_problem(workflow({"ref": "a", "task": "noop", "depends_on": ["ghost"]}))
    assert "depends on unknown step 'ghost'" in problem


def test_two_step_cycle() -> None:
    problem = one_problem(
        workflow(
            {"ref": "a", "task": "noop", "depends_on": ["b"]},
            {"ref": "b", "task": "noop", "depends_on": ["a"]},
        )
    )
    assert problem.startswith("dependency cycle: a -> b -> a (")


def test_longer_cycle_behind_a_valid_step() -> None:
    problem = one_problem(
        workflow(
            {"ref": "start", "task": "noop"},
            {"ref": "x", "task": "noop", "depends_on": ["start", "z"], "inputs": {}},
            {"ref": "y", "task": "noop", "depends_on": ["x"]},
            {"ref": "z", "task": "noop", "depends_on": ["y"]},
        )
    )
    assert problem.startswith("dependency cycle: x -> z -> y -> x (")


def test_self_dependency() -> None:
    problem = one_problem(workflow({"ref": "a", "task": "noop", "depends_on": ["a"]}))
    assert "step 'a' depends on itself" in problem


def test_empty_task_list() -> None:
    assert "is empty" in one_problem(workflow())


@pytest.mark.parametrize(
    ("defn", "fragment"),
    [
        (workflow({"ref": "a", "task": "noop"}, name="bad name"), "workflow name 'bad name'"),
        (workflow({"ref": "a", "task": "noop"}, name=""), "workflow name ''"),
        (workflow({"ref": "1st", "task": "noop"}), "step name '1st'"),
        (workflow({"ref": "a" * 65, "task": "noop"}), "step name"),
        (workflow({"ref": "a", "task": "no op"}), "task name 'no op'"),
        (workflow({"ref": 3, "task": "noop"}), "step name must be a string"),
    ],
)
def test_bad_names(defn: dict[str, Any], fragment: str) -> None:
    assert fragment in one_problem(defn)


@pytest.mark.parametrize(
    ("defn", "fragment"),
    [
        ([], "must be an object"),
        ({"tasks": [{"ref": "a", "task": "noop"}]}, "missing 'name'"),
        ({"name": "wf"}, "'tasks' must be a list"),
        ({**workflow({"ref": "a", "task": "noop"}), "steps": []}, "unknown field 'steps'"),
        ({**workflow({"ref": "a", "task": "noop"}), "description": 5}, "'description'"),
        ({"name": "wf", "tasks": ["deblur"]}, "tasks[0]: must be an object"),
        (workflow({"task": "noop"}), "missing 'ref'"),
        (workflow({"ref": "a"}), "missing 'task'"),
        (workflow({"ref": "a", "task": "noop", "depends": ["b"]}), "unknown field 'depends'"),
        (workflow({"ref": "a", "task": "noop", "depends_on": "b"}), "must be a list of step"),
        (workflow({"ref": "a", "task": "noop", "params": [1]}), "'params' must be an object"),
    ],
)
def test_shape_errors(defn: Any, fragment: str) -> None:
    assert fragment in one_problem(defn)


def test_repeated_dependency() -> None:
    defn = workflow(
        {"ref": "a", "task": "noop"},
        {"ref": "b", "task": "noop", "depends_on": ["a", "a"]},
    )
    assert "more than once" in one_problem(defn)


def test_all_problems_are_reported_at_once() -> None:
    defn = workflow(
        {"ref": "a", "task": "nope"},
        {"ref": "a", "task": "noop"},
        {"ref": "b", "task": "noop", "depends_on": ["ghost"]},
        name="bad name",
    )
    with pytest.raises(InvalidDefinition) as info:
        parse_workflow(defn, KNOWN)
    assert len(info.value.problems) == 4
    assert "4 problem(s)" in str(info.value) and "ghost" in str(info.value)


def test_dataclass_input_is_validated_too() -> None:
    defn = WorkflowDefinition("wf", "", (Step("a", "noop", ("a",)),))
    assert validate_workflow(defn, KNOWN) != []
    with pytest.raises(InvalidDefinition):
        defn.order()


def test_validation_does_not_modify_input() -> None:
    defn = workflow({"ref": "a", "task": "noop", "depends_on": ["a", "ghost"]})
    snapshot = copy.deepcopy(defn)
    validate_workflow(defn, KNOWN)
    assert defn == snapshot


# --- task definitions ------------------------------------------------------------------------


GOOD_TASK = {"name": "t", "module": "pkg.mod:fn", "timeout_s": 5, "retries": 1}


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"module": "pkg.mod"}, "not of the form"),
        ({"module": None}, "missing 'module'"),
        ({"name": "t t"}, "task name 't t'"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"timeout_s": "30"}, "timeout_s"),
        ({"retries": True}, "retries"),
        ({"retries": 11}, "retries"),
        ({"retry_backoff_s": -1}, "retry_backoff_s"),
        ({"memory": 3}, "unknown field 'memory'"),
    ],
)
def test_task_definition_errors(change: dict[str, Any], fragment: str) -> None:
    data = {k: v for k, v in {**GOOD_TASK, **change}.items() if v is not None}
    problems = task_definition_problems(data)
    assert len(problems) == 1 and fragment in problems[0], problems
    with pytest.raises(InvalidDefinition):
        parse_task_definition(data)


def test_task_definition_defaults() -> None:
    parsed = parse_task_definition({"name": "t", "module": "pkg.mod:Class.method"})
    assert (parsed.timeout_s, parsed.retries, parsed.retry_backoff_s) == (30.0, 0, 0.5)
    assert task_definition_problems("x") == ["task definition must be an object, got str"]
