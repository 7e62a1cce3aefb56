"""Workflow and task definitions: the JSON shapes, their validation and the bundled ones.

A workflow definition (also the REST API's request body)::

    {"name": "image_pipeline", "description": "...",
     "tasks": [{"ref": "deblur", "task": "deblur"},
               {"ref": "denoise", "task": "denoise", "depends_on": ["deblur"]},
               {"ref": "classify", "task": "classify", "depends_on": ["denoise"],
                "params": {}}]}

``ref`` names a step inside the workflow, ``task`` names a task definition, ``depends_on``
lists refs that must finish first and the optional ``params`` object reaches the task as
``ctx.params``. A task definition::

    {"name": "deblur", "module": "workflows.image_tasks:deblur",
     "timeout_s": 30, "retries": 2, "retry_backoff_s": 0.5}

Validation collects *every* problem rather than stopping at the first, so one round trip
tells a user all there is to fix. Names follow ``workflows.names.NAME_RE``.
"""

from __future__ import annotations

import copy
import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from workflows.errors import InvalidDefinition
from workflows.names import MODULE_PATH_RE, name_problem

__all__ = [
    "IMAGE_PIPELINE",
    "NOOP_PIPELINE",
    "TASK_DEFINITIONS",
    "Step",
    "TaskDefinition",
    "WorkflowDefinition",
    "bundled_task_definitions",
    "bundled_workflows",
    "chain_problems",
    "parse_task_definition",
    "parse_workflow",
    "task_definition_problems",
    "validate_workflow",
]

# Bounds that keep a definition from the REST API sane; generous for real work.
MAX_TIMEOUT_S: Final = 24 * 3600.0
MAX_RETRIES: Final = 10
MAX_BACKOFF_S: Final = 3600.0

_WORKFLOW_KEYS: Final = frozenset({"name", "description", "tasks"})
_STEP_KEYS: Final = frozenset({"ref", "task", "depends_on", "params"})
_TASK_KEYS: Final = frozenset({"name", "module", "timeout_s", "retries", "retry_backoff_s"})


@dataclass(frozen=True)
class TaskDefinition:
    name: str
    module: str  # "package.module:function"
    timeout_s: float = 30.0
    retries: int = 0
    retry_backoff_s: float = 0.5

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "module": self.module,
            "timeout_s": self.timeout_s,
            "retries": self.retries,
            "retry_backoff_s": self.retry_backoff_s,
        }


@dataclass(frozen=True)
class Step:
    ref: str
    task: str
    depends_on: tuple[str, ...] = ()
    params: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"ref": self.ref, "task": self.task}
        if self.depends_on:
            out["depends_on"] = list(self.depends_on)
        if self.params:
            out["params"] = copy.deepcopy(dict(self.params))
        return out


@dataclass(frozen=True)
class WorkflowDefinition:
    name: str
    description: str
    tasks: tuple[Step, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "tasks": [s.to_dict() for s in self.tasks],
        }

    def order(self) -> list[str]:
        """Step refs in an order where every step comes after its dependencies."""
        done: set[str] = set()
        out: list[str] = []
        pending = list(self.tasks)
        while pending:  # a validated definition makes progress on every pass
            ready = [s for s in pending if done.issuperset(s.depends_on)]
            if not ready:
                stuck = ", ".join(s.ref for s in pending)
                raise InvalidDefinition(
                    [f"steps {stuck} wait on a cycle or an unknown step"], f"workflow {self.name!r}"
                )
            for s in ready:
                out.append(s.ref)
                done.add(s.ref)
            pending = [s for s in pending if s.ref not in done]
        return out


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _unknown_keys(where: str, data: Mapping[str, Any], allowed: frozenset[str]) -> list[str]:
    return [
        f"{where}: unknown field {key!r} (allowed: {', '.join(sorted(allowed))})"
        for key in data
        if key not in allowed
    ]


def task_definition_problems(data: Any, *, check_module: bool = True) -> list[str]:
    """Every problem with a task definition dict; empty when it is valid.

    ``check_module`` checks the ``module`` syntax only (nothing is imported).
    """
    if not isinstance(data, Mapping):
        return [f"task definition must be an object, got {type(data).__name__}"]
    problems = _unknown_keys("task definition", data, _TASK_KEYS)
    if "name" not in data:
        problems.append("task definition: missing 'name'")
    elif (p := name_problem("task", data["name"])) is not None:
        problems.append(p)
    module = data.get("module")
    if module is None:
        problems.append("task definition: missing 'module' ('package.module:function')")
    elif check_module and (not isinstance(module, str) or not MODULE_PATH_RE.fullmatch(module)):
        problems.append(f"task module {module!r} is not of the form 'package.module:function'")
    timeout = data.get("timeout_s", 30.0)
    if not _is_number(timeout) or not 0 < timeout <= MAX_TIMEOUT_S:
        problems.append(f"timeout_s must be a number in (0, {MAX_TIMEOUT_S:g}], got {timeout!r}")
    retries = data.get("retries", 0)
    if not isinstance(retries, int) or isinstance(retries, bool) or not 0 <= retries <= MAX_RETRIES:
        problems.append(f"retries must be an integer in 0..{MAX_RETRIES}, got {retries!r}")
    backoff = data.get("retry_backoff_s", 0.5)
    if not _is_number(backoff) or not 0 <= backoff <= MAX_BACKOFF_S:
        problems.append(
            f"retry_backoff_s must be a number in [0, {MAX_BACKOFF_S:g}], got {backoff!r}"
        )
    return problems


def parse_task_definition(data: Any) -> TaskDefinition:
    """A validated ``TaskDefinition``; raises ``InvalidDefinition`` listing every problem."""
    problems = task_definition_problems(data)
    if problems:
        raise InvalidDefinition(problems, "task definition")
    return TaskDefinition(
        name=data["name"],
        module=data["module"],
        timeout_s=float(data.get("timeout_s", 30.0)),
        retries=int(data.get("retries", 0)),
        retry_backoff_s=float(data.get("retry_backoff_s", 0.5)),
    )


def validate_workflow(
    defn: Mapping[str, Any] | WorkflowDefinition, known_tasks: Iterable[str]
) -> list[str]:
    """Every problem with a workflow definition; an empty list means it is valid.

    Checks: shape and field types, unknown fields, bad names, empty task list, unknown task,
    duplicate ref, unknown or repeated dependency, self-dependency, dependency cycles, and that
    the steps form one chain (``_not_a_chain``).
    """
    data: Any = defn.to_dict() if isinstance(defn, WorkflowDefinition) else defn
    if not isinstance(data, Mapping):
        return [f"workflow definition must be an object, got {type(data).__name__}"]
    known = set(known_tasks)
    problems = _unknown_keys("workflow", data, _WORKFLOW_KEYS)
    if "name" not in data:
        problems.append("workflow: missing 'name'")
    elif (p := name_problem("workflow", data["name"])) is not None:
        problems.append(p)
    if not isinstance(data.get("description", ""), str):
        problems.append("workflow: 'description' must be a string")
    steps = data.get("tasks")
    if not isinstance(steps, list):
        problems.append("workflow: 'tasks' must be a list of steps")
        return problems
    if not steps:
        problems.append("workflow: 'tasks' is empty; a workflow needs at least one step")
        return problems
    graph: dict[str, list[str]] = {}
    for i, step in enumerate(steps):
        problems += _step_problems(i, step, known, graph)
    for ref, deps in graph.items():
        problems += [
            f"step {ref!r}: depends on unknown step {dep!r}" for dep in deps if dep not in graph
        ]
    cycles = _cycles(graph)
    problems += [
        f"dependency cycle: {' -> '.join(c)} (each step depends on the next)" for c in cycles
    ]
    if not cycles and all(d in graph for deps in graph.values() for d in deps):
        problems += _not_a_chain(graph)
    return problems


def chain_problems(steps: Iterable[Mapping[str, Any]]) -> list[str]:
    """Why stored steps (``[{"ref", "depends_on"}, ...]``) are not one chain; empty if they are."""
    return _not_a_chain({s["ref"]: list(s.get("depends_on") or []) for s in steps})


def _not_a_chain(graph: Mapping[str, list[str]]) -> list[str]:
    """Problems that make a valid DAG other than a single chain of steps.

    *Why refused:* steps run one after another, each on the image the step before it left, so
    a fork would run its second branch on the first branch's output and a join would see one
    input: wrong results with no warning. Parallel branches are not supported yet.
    """
    hint = "; parallel branches and joins are not supported yet: make the steps one chain"
    roots = [ref for ref, deps in graph.items() if not deps]
    problems = [
        f"step {ref!r}: depends on {len(deps)} steps ({', '.join(map(repr, deps))}){hint}"
        for ref, deps in graph.items()
        if len(deps) > 1
    ]
    if len(roots) > 1:
        problems.append(
            f"steps {', '.join(map(repr, roots))} all start the workflow (none depends on "
            f"another){hint}"
        )
    followers: dict[str, list[str]] = {}
    for ref, deps in graph.items():
        for dep in deps:
            followers.setdefault(dep, []).append(ref)
    problems += [
        f"steps {', '.join(map(repr, refs))} all depend on step {dep!r}{hint}"
        for dep, refs in followers.items()
        if len(refs) > 1
    ]
    return problems


def _step_problems(i: int, step: Any, known: set[str], graph: dict[str, list[str]]) -> list[str]:
    """Problems local to ``tasks[i]``; records its ref and dependencies in ``graph``."""
    where = f"tasks[{i}]"
    if not isinstance(step, Mapping):
        return [f"{where}: must be an object, got {type(step).__name__}"]
    problems = _unknown_keys(where, step, _STEP_KEYS)
    ref = step.get("ref")
    if ref is None:
        problems.append(f"{where}: missing 'ref'")
    elif (p := name_problem("step", ref)) is not None:
        problems.append(f"{where}: {p}")
        ref = None
    elif ref in graph:
        problems.append(f"{where}: duplicate ref {ref!r}")
        ref = None
    task = step.get("task")
    if task is None:
        problems.append(f"{where}: missing 'task'")
    elif (p := name_problem("task", task)) is not None:
        problems.append(f"{where}: {p}")
    elif task not in known:
        close = difflib.get_close_matches(task, sorted(known), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        listed = ", ".join(sorted(known)) or "none"
        problems.append(f"{where}: unknown task {task!r} (known: {listed}){hint}")
    deps = step.get("depends_on", [])
    if not isinstance(deps, list) or not all(isinstance(d, str) for d in deps):
        problems.append(f"{where}: 'depends_on' must be a list of step refs")
        deps = []
    if len(set(deps)) != len(deps):
        problems.append(f"{where}: 'depends_on' lists a step more than once")
    if ref is not None and ref in deps:
        problems.append(f"{where}: step {ref!r} depends on itself")
    if not isinstance(step.get("params", {}), Mapping):
        problems.append(f"{where}: 'params' must be an object")
    if ref is not None:
        graph[ref] = [d for d in dict.fromkeys(deps) if d != ref]
    return problems


def _cycles(graph: dict[str, list[str]]) -> list[list[str]]:
    """One cycle (as a closed path) per back edge found by an iterative depth-first search."""
    state: dict[str, int] = {}  # absent: unvisited, 1: on the current path, 2: finished
    found: list[list[str]] = []
    for root in graph:
        if root in state:
            continue
        path: list[str] = [root]
        iters = [iter(graph[root])]
        state[root] = 1
        while iters:
            dep = next(iters[-1], None)
            if dep is None:
                state[path.pop()] = 2
                iters.pop()
            elif dep not in graph or state.get(dep) == 2:
                continue
            elif state.get(dep) == 1:
                found.append([*path[path.index(dep) :], dep])
            else:
                state[dep] = 1
                path.append(dep)
                iters.append(iter(graph[dep]))
    return found


def parse_workflow(data: Any, known_tasks: Iterable[str]) -> WorkflowDefinition:
    """A validated ``WorkflowDefinition``; raises ``InvalidDefinition`` listing every problem."""
    problems = validate_workflow(data, known_tasks)
    if problems:
        name = data.get("name") if isinstance(data, Mapping) else None
        raise InvalidDefinition(problems, f"workflow {name!r}" if name else "workflow")
    steps = tuple(
        Step(
            ref=s["ref"],
            task=s["task"],
            depends_on=tuple(s.get("depends_on", ())),
            params=copy.deepcopy(dict(s.get("params", {}))),
        )
        for s in data["tasks"]
    )
    return WorkflowDefinition(data["name"], data.get("description", ""), steps)


# --- bundled definitions -------------------------------------------------------------------

TASK_DEFINITIONS: Final[list[dict[str, Any]]] = [
    {"name": "deblur", "module": "workflows.image_tasks:deblur",
     "timeout_s": 30.0, "retries": 2, "retry_backoff_s": 0.5},
    {"name": "denoise", "module": "workflows.image_tasks:denoise",
     "timeout_s": 30.0, "retries": 2, "retry_backoff_s": 0.5},
    {"name": "classify", "module": "workflows.image_tasks:classify",
     "timeout_s": 30.0, "retries": 2, "retry_backoff_s": 0.5},
    {"name": "noop", "module": "workflows.image_tasks:noop",
     "timeout_s": 10.0, "retries": 0, "retry_backoff_s": 0.5},
    {"name": "sleep", "module": "workflows.image_tasks:sleep",
     "timeout_s": 60.0, "retries": 0, "retry_backoff_s": 0.5},
]  # fmt: skip

IMAGE_PIPELINE: Final[dict[str, Any]] = {
    "name": "image_pipeline",
    "description": "Sharpen (unsharp mask), smooth (Gaussian blur), then label the image "
    "from its colour statistics.",
    "tasks": [
        {"ref": "deblur", "task": "deblur"},
        {"ref": "denoise", "task": "denoise", "depends_on": ["deblur"]},
        {"ref": "classify", "task": "classify", "depends_on": ["denoise"]},
    ],
}

NOOP_PIPELINE: Final[dict[str, Any]] = {
    "name": "noop_pipeline",
    "description": "Three chained no-op tasks: measures orchestration and data-movement "
    "overhead with no compute.",
    "tasks": [
        {"ref": "noop1", "task": "noop"},
        {"ref": "noop2", "task": "noop", "depends_on": ["noop1"]},
        {"ref": "noop3", "task": "noop", "depends_on": ["noop2"]},
    ],
}


def bundled_workflows() -> dict[str, dict[str, Any]]:
    """The bundled workflow definitions by name (deep copies: safe to modify)."""
    return {d["name"]: copy.deepcopy(d) for d in (IMAGE_PIPELINE, NOOP_PIPELINE)}


def bundled_task_definitions() -> list[dict[str, Any]]:
    """The bundled task definitions (deep copies: safe to modify)."""
    return copy.deepcopy(TASK_DEFINITIONS)
