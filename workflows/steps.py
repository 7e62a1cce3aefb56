"""The checks of a workflow definition's steps: each step alone, then the graph they make.

A step is one of three kinds:

* a **task** step (``task``): runs a registered task. ``inputs`` maps the function's parameters
  to data (``"<ref>.<output>"``, ``"input.<name>"``, or a list of such: the first whose step
  ran and produced it); without ``inputs`` it reads the single-image chain's ``image`` — from
  the one step it depends on, or the workflow's input image when it depends on none.
  ``for_each`` names one of its inputs, a list: the step runs once per element.
* a **switch** step (``switch: "<ref>.<output>"``): compares that JSON value with the keys of
  ``cases`` (each a list of refs; ``default`` when none matches) and the steps of every other
  case end ``SKIPPED``. Steps listed in ``cases`` run after the switch.
* a **sub-workflow** step (``workflow``): runs another registered definition on its
  ``inputs`` (the sub-workflow's ``input.<name>``); later steps read its outputs.

Every edge of the graph — ``depends_on``, each ref an input reads, a switch's value and cases —
orders the steps; the graph may have no cycle.
"""

from __future__ import annotations

import difflib
import keyword
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from workflows.names import NAME_RE, name_problem

__all__ = [
    "INPUT",
    "STEP_KEYS",
    "DataRef",
    "Shape",
    "cycles",
    "graph_problems",
    "parse_ref",
    "step_problems",
]

INPUT: Final = "input"  # the ref that names the workflow's own inputs (``input.image``)
STEP_KEYS: Final = frozenset(
    {"ref", "task", "depends_on", "params", "inputs", "for_each", "switch", "cases", "default",
     "workflow"}
)  # fmt: skip
_KINDS: Final = ("task", "switch", "workflow")
_FOR_TASKS: Final = ("params", "for_each")
_FOR_SWITCHES: Final = ("cases", "default")
MAX_INPUTS: Final = 64


@dataclass(frozen=True)
class DataRef:
    """One datum a step reads: output ``output`` of step ``ref`` (``INPUT``: the workflow's)."""

    ref: str
    output: str

    def __str__(self) -> str:
        return f"{self.ref}.{self.output}"


def parse_ref(text: Any) -> DataRef | None:
    """``"<ref>.<output>"`` as a ``DataRef``; None if it is not of that form."""
    if not isinstance(text, str) or text.count(".") != 1:
        return None
    ref, output = text.split(".")
    if NAME_RE.fullmatch(ref) is None or NAME_RE.fullmatch(output) is None:
        return None
    return DataRef(ref, output)


@dataclass
class Shape:
    """A step as far as the graph checks need it (only for steps with a usable ref)."""

    ref: str
    kind: str  # "task", "switch" or "workflow"
    depends_on: list[str]
    reads: list[DataRef]  # every datum its inputs (or its switch) name
    inputs_given: bool  # False: the single-image chain's default
    cases: list[str]  # a switch's refs, every case and the default


def step_problems(
    i: int,
    step: Any,
    known_tasks: set[str],
    known_workflows: set[str] | None,
    shapes: dict[str, Shape],
) -> list[str]:
    """Problems local to ``tasks[i]``; records its ``Shape`` in ``shapes`` by ref."""
    where = f"tasks[{i}]"
    if not isinstance(step, Mapping):
        return [f"{where}: must be an object, got {type(step).__name__}"]
    problems = [
        f"{where}: unknown field {key!r} (allowed: {', '.join(sorted(STEP_KEYS))})"
        for key in step
        if key not in STEP_KEYS
    ]
    ref = step.get("ref")
    if ref is None:
        problems.append(f"{where}: missing 'ref'")
    elif (p := name_problem("step", ref)) is not None:
        problems.append(f"{where}: {p}")
        ref = None
    elif ref == INPUT:
        problems.append(
            f"{where}: a step may not be called {INPUT!r} (it names the workflow's inputs)"
        )
        ref = None
    elif ref in shapes:
        problems.append(f"{where}: duplicate ref {ref!r}")
        ref = None
    kinds = [k for k in _KINDS if step.get(k) is not None]
    if not kinds:
        problems.append(f"{where}: missing 'task' (or 'switch', or 'workflow')")
    elif len(kinds) > 1:
        problems.append(f"{where}: a step is one of {', '.join(kinds)}, not several")
    kind = kinds[0] if kinds else "task"
    if kind == "task" and "task" in step:
        problems += _name_in(where, "task", step["task"], known_tasks)
    if kind == "workflow" and known_workflows is not None:
        problems += _name_in(where, "workflow", step["workflow"], known_workflows)
    elif kind == "workflow" and (p := name_problem("workflow", step["workflow"])) is not None:
        problems.append(f"{where}: {p}")
    problems += [
        f"{where}: {field!r} belongs to task steps" for field in _FOR_TASKS
        if step.get(field) not in (None, {}) and kind != "task"
    ]  # fmt: skip
    problems += [
        f"{where}: {field!r} belongs to switch steps" for field in _FOR_SWITCHES
        if field in step and kind != "switch"
    ]  # fmt: skip
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
    reads: list[DataRef] = []
    inputs = step.get("inputs")
    if inputs is not None:
        problems += _input_problems(where, inputs, reads)
        if kind == "switch":
            problems.append(f"{where}: a switch step reads only its 'switch' value, not 'inputs'")
    for_each = step.get("for_each")
    if for_each is not None and (not isinstance(inputs, Mapping) or for_each not in inputs):
        problems.append(
            f"{where}: 'for_each' must name one of the step's 'inputs' (the list it runs over), "
            f"got {for_each!r}"
        )
    cases: list[str] = []
    if kind == "switch":
        problems += _switch_problems(where, step, reads, cases)
    if ref is not None:
        problems += [
            f"{where}: step {ref!r} reads its own output {r}" for r in reads if r.ref == ref
        ]
        shapes[ref] = Shape(
            ref, kind, [d for d in dict.fromkeys(deps) if d != ref], reads, inputs is not None,
            cases,
        )  # fmt: skip
    return problems


def _name_in(where: str, kind: str, name: Any, known: set[str]) -> list[str]:
    if (p := name_problem(kind, name)) is not None:
        return [f"{where}: {p}"]
    if name in known:
        return []
    close = difflib.get_close_matches(name, sorted(known), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    listed = ", ".join(sorted(known)) or "none"
    return [f"{where}: unknown {kind} {name!r} (known: {listed}){hint}"]


def _input_problems(where: str, inputs: Any, reads: list[DataRef]) -> list[str]:
    if not isinstance(inputs, Mapping):
        return [f"{where}: 'inputs' must be an object of parameter name -> \"<ref>.<output>\""]
    if len(inputs) > MAX_INPUTS:
        return [f"{where}: 'inputs' names {len(inputs)} parameters; at most {MAX_INPUTS}"]
    problems = []
    for name, given in inputs.items():
        if not name.isidentifier() or keyword.iskeyword(name) or len(name) > 64:
            problems.append(f"{where}: input name {name!r} is not a Python parameter name")
        alternatives = given if isinstance(given, list) else [given]
        if not alternatives:
            problems.append(f"{where}: input {name!r} lists no data")
        for text in alternatives:
            parsed = parse_ref(text)
            if parsed is None:
                problems.append(
                    f'{where}: input {name!r}: {text!r} is not "<ref>.<output>" (or '
                    '"input.<name>", or a list of those)'
                )
            else:
                reads.append(parsed)
    return problems


def _switch_problems(
    where: str, step: Mapping[str, Any], reads: list[DataRef], cases: list[str]
) -> list[str]:
    problems = []
    value = parse_ref(step["switch"])
    if value is None:
        problems.append(f"{where}: 'switch' must be \"<ref>.<output>\", got {step['switch']!r}")
    else:
        reads.append(value)
    given = step.get("cases", {})
    default = step.get("default", [])
    if not isinstance(given, Mapping) or not all(_refs(v) for v in given.values()):
        problems.append(f"{where}: 'cases' must be an object of value -> list of step refs")
        given = {}
    if not _refs(default):
        problems.append(f"{where}: 'default' must be a list of step refs")
        default = []
    if not given and not default:
        problems.append(f"{where}: a switch needs 'cases' (value -> steps), or a 'default'")
    for refs in [*given.values(), default]:
        cases.extend(r for r in refs if r not in cases)
    return problems


def _refs(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(r, str) for r in value)


def graph_problems(shapes: Mapping[str, Shape]) -> list[str]:
    """Problems of the graph the steps make: unknown refs, cycles, and steps whose input the
    default cannot tell."""
    problems = []
    for s in shapes.values():
        problems += [
            f"step {s.ref!r}: depends on unknown step {dep!r}"
            for dep in s.depends_on
            if dep not in shapes
        ]
        for read in s.reads:
            source = shapes.get(read.ref)
            if read.ref == INPUT:
                continue
            if source is None:
                problems.append(f"step {s.ref!r}: reads {read}, but there is no step {read.ref!r}")
            elif source.kind == "switch":
                problems.append(
                    f"step {s.ref!r}: reads {read}, but switch {read.ref!r} has no outputs; read "
                    "the step its value comes from"
                )
        problems += [
            f"switch {s.ref!r}: case lists unknown step {ref!r}"
            for ref in s.cases
            if ref not in shapes
        ]
        if s.ref in s.cases:
            problems.append(f"switch {s.ref!r}: lists itself in its cases")
        if s.kind != "switch" and not s.inputs_given:
            problems += _default_problems(s, shapes)
    graph = edges(shapes)
    problems += [
        f"dependency cycle: {' -> '.join(c)} (each step depends on the next)" for c in cycles(graph)
    ]
    return problems


def _default_problems(s: Shape, shapes: Mapping[str, Shape]) -> list[str]:
    """A step that names no inputs reads ``image`` of the one step it depends on."""
    if len(s.depends_on) > 1:
        refs = ", ".join(map(repr, s.depends_on))
        example = ", ".join(f'"{d}": "{d}.image"' for d in s.depends_on[:2])
        return [
            f"step {s.ref!r}: depends on {len(s.depends_on)} steps ({refs}) and names no "
            f"'inputs', so which image it reads is not said; name them, e.g. "
            f'"inputs": {{{example}}} (a join gets every input it names)'
        ]
    if s.depends_on and (dep := shapes.get(s.depends_on[0])) is not None and dep.kind == "switch":
        return [
            f"step {s.ref!r}: depends only on switch {dep.ref!r}, which has no image; name its "
            "'inputs', or depend on the step whose image it reads"
        ]
    return []


def edges(shapes: Mapping[str, Shape]) -> dict[str, list[str]]:
    """Each step with every step that must end before it (known refs only)."""
    graph: dict[str, list[str]] = {ref: [] for ref in shapes}
    for s in shapes.values():
        before = [*s.depends_on, *(r.ref for r in s.reads)]
        graph[s.ref].extend(b for b in dict.fromkeys(before) if b in shapes and b != s.ref)
        for member in s.cases:
            if member in graph and member != s.ref and s.ref not in graph[member]:
                graph[member].append(s.ref)
    return graph


def cycles(graph: Mapping[str, list[str]]) -> list[list[str]]:
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


def topological(graph: Mapping[str, Iterable[str]]) -> list[str]:
    """The refs of an acyclic ``graph`` (ref -> refs before it), each after those before it,
    in the graph's own order where the edges leave a choice."""
    done: set[str] = set()
    order: list[str] = []
    pending = list(graph)
    while pending:
        ready = [r for r in pending if done.issuperset(graph[r])]
        if not ready:
            raise ValueError(f"steps {', '.join(pending)} wait on a cycle or an unknown step")
        for r in ready:
            order.append(r)
            done.add(r)
        pending = [r for r in pending if r not in done]
    return order
