"""The checks of a workflow definition's steps: each step alone, then the graph they make.

A step is one of three kinds (``StepKind``; what each may hold and how the graph reads it is
its row in ``STEP_KINDS``):

* a **task** step (``task``): runs a registered task. ``inputs`` maps the function's parameters
  to data (``"<ref>.<output>"``, ``"input.<name>"``, or a list of such: the first whose step
  ran and produced it); without ``inputs`` it reads the single-image chain's ``image`` — from
  the one step it depends on, or the workflow's input image when it depends on none.
  ``for_each`` names one of its inputs, a list: the step runs once per element.
  ``channels`` (``{"publish": [names], "subscribe": [names]}``) makes it a *streaming* step:
  a long-running task that reads and writes items on channels of its run while its peers
  run (``docs/streaming.md``). Each channel has one publishing step and at least one
  subscriber; the steps joined by channels form a *streaming group* that starts at once.
* a **switch** step (``switch: "<ref>.<output>"``): compares that JSON value with the keys of
  ``cases`` (each a list of refs; ``default`` when none matches) and the steps of every other
  case end ``SKIPPED``. Steps listed in ``cases`` run after the switch.
* a **sub-workflow** step (``workflow``): runs another registered definition on its
  ``inputs`` (the sub-workflow's ``input.<name>``); later steps read its outputs.

Adding a kind: its ``StepKind`` member (its value is the field that names it), its row in
``STEP_KINDS``, the field in ``STEP_KEYS``, ``definitions.Step`` and the API's ``StepSchema``,
what it becomes in the graph that runs (``graph.build_graph``), and its tests.

Every edge of the graph — ``depends_on``, each ref an input reads, a switch's value and cases —
orders the steps; the graph may have no cycle.
"""

from __future__ import annotations

import difflib
import enum
import keyword
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from workflows.names import NAME_RE, name_problem

__all__ = [
    "INPUT",
    "STEP_KEYS",
    "STEP_KINDS",
    "DataRef",
    "KindRule",
    "Shape",
    "StepKind",
    "cycles",
    "graph_problems",
    "parse_ref",
    "step_kind",
    "step_problems",
    "stream_groups",
]

INPUT: Final = "input"  # the ref that names the workflow's own inputs (``input.image``)
STEP_KEYS: Final = frozenset(
    {"ref", "task", "depends_on", "params", "inputs", "for_each", "switch", "cases", "default",
     "workflow", "channels"}
)  # fmt: skip
CHANNEL_ROLES: Final = ("publish", "subscribe")  # the keys of a streaming step's ``channels``
MAX_INPUTS: Final = 64


class StepKind(enum.StrEnum):
    """What a step is; the value is the field that names it (``{"task": "deblur"}``)."""

    TASK = "task"
    SWITCH = "switch"
    WORKFLOW = "workflow"


def step_kind(step: Mapping[str, Any]) -> StepKind | None:
    """The kind of a step (as stored: valid), by the first kind's field it sets; None when it
    sets none (a kind a later version added)."""
    return next((k for k in StepKind if step.get(k) is not None), None)


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
    kind: StepKind
    depends_on: list[str]
    reads: list[DataRef]  # every datum its inputs (or its switch) name
    inputs_given: bool  # False: the single-image chain's default
    cases: list[str]  # a switch's refs, every case and the default
    publish: list[str] = field(default_factory=list)  # channels it writes (a streaming step)
    subscribe: list[str] = field(default_factory=list)  # channels it reads


@dataclass
class _Step:
    """One step being checked: where it is, what it may name, and what it reads."""

    where: str  # "tasks[<i>]"
    data: Mapping[str, Any]
    known_tasks: set[str]
    known_workflows: set[str] | None  # None: not checked (only the name's form)
    reads: list[DataRef] = field(default_factory=list)  # every datum it names
    cases: list[str] = field(default_factory=list)  # a switch's refs, every case and default


@dataclass(frozen=True)
class KindRule:
    """What a step of one kind may hold, and how the graph checks read it."""

    noun: str  # what a person calls it
    fields: tuple[str, ...]  # fields only a step of this kind may set (besides its own)
    check: Callable[[_Step], list[str]]  # its own problems (its name, its switch ...)
    takes_inputs: bool = True  # it reads ``inputs`` (or the chain's image when it names none)
    has_outputs: bool = True  # later steps may read what it makes


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
    kinds = [k for k in StepKind if step.get(k) is not None]
    if not kinds:
        first, *others = StepKind
        named = ", or ".join(repr(str(k)) for k in others)
        problems.append(f"{where}: missing {str(first)!r} (or {named})")
    elif len(kinds) > 1:
        problems.append(f"{where}: a step is one of {', '.join(kinds)}, not several")
    kind = kinds[0] if kinds else StepKind.TASK
    rule = STEP_KINDS[kind]
    checked = _Step(where, step, known_tasks, known_workflows)
    if kind in step:
        problems += rule.check(checked)
    publish, subscribe = _channel_lists(where, step.get("channels"), problems)
    if (publish or subscribe) and step.get("for_each") is not None:
        problems.append(
            f"{where}: a streaming step (one with 'channels') runs once; it cannot 'for_each'"
        )
    problems += [
        f"{where}: {field!r} belongs to {other.noun} steps"
        for other_kind, other in STEP_KINDS.items() if other_kind is not kind
        for field in other.fields if step.get(field) not in (None, {})
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
    reads = checked.reads
    inputs = step.get("inputs")
    if inputs is not None:
        problems += _input_problems(where, inputs, reads)
        if not rule.takes_inputs:
            problems.append(f"{where}: a {rule.noun} step reads only its {str(kind)!r} value, "
                            "not 'inputs'")  # fmt: skip
    for_each = step.get("for_each")
    if for_each is not None and (not isinstance(inputs, Mapping) or for_each not in inputs):
        problems.append(
            f"{where}: 'for_each' must name one of the step's 'inputs' (the list it runs over), "
            f"got {for_each!r}"
        )
    if ref is not None:
        problems += [
            f"{where}: step {ref!r} reads its own output {r}" for r in reads if r.ref == ref
        ]
        shapes[ref] = Shape(
            ref, kind, [d for d in dict.fromkeys(deps) if d != ref], reads, inputs is not None,
            checked.cases, publish, subscribe,
        )  # fmt: skip
    return problems


def _channel_lists(where: str, given: Any, problems: list[str]) -> tuple[list[str], list[str]]:
    """The channels a step publishes and subscribes to (``channels``), adding what is wrong
    with them to ``problems``."""
    if given is None:
        return [], []
    shape = (f'{where}: \'channels\' must be an object {{"publish": [names], "subscribe": '
             '[names]}} (either may be left out)')  # fmt: skip
    if not isinstance(given, Mapping) or not given:
        problems.append(shape)
        return [], []
    problems += [
        f"{where}: 'channels': unknown field {key!r} (allowed: {', '.join(CHANNEL_ROLES)})"
        for key in given
        if key not in CHANNEL_ROLES
    ]
    lists: list[list[str]] = []
    for role in CHANNEL_ROLES:
        names = given.get(role, [])
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            problems.append(f"{where}: 'channels.{role}' must be a list of channel names")
            names = []
        for name in names:
            if (p := name_problem("channel", name)) is not None:
                problems.append(f"{where}: {p}")
        if len(set(names)) != len(names):
            problems.append(f"{where}: 'channels.{role}' lists a channel more than once")
        lists.append([n for n in dict.fromkeys(names) if name_problem("channel", n) is None])
    publish, subscribe = lists
    both = sorted(set(publish) & set(subscribe))
    if both:
        problems.append(
            f"{where}: a step does not subscribe to its own channel ({', '.join(both)})"
        )
    if not publish and not subscribe and isinstance(given, Mapping) and given:
        problems.append(f"{where}: 'channels' names no channel")
    return publish, subscribe


def _task_problems(step: _Step) -> list[str]:
    return _name_in(step.where, "task", step.data["task"], step.known_tasks)


def _workflow_problems(step: _Step) -> list[str]:
    name = step.data["workflow"]
    if step.known_workflows is not None:
        return _name_in(step.where, "workflow", name, step.known_workflows)
    problem = name_problem("workflow", name)
    return [] if problem is None else [f"{step.where}: {problem}"]


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


def _switch_problems(checked: _Step) -> list[str]:
    where, step, reads, cases = checked.where, checked.data, checked.reads, checked.cases
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


# What each kind of step may hold and how the graph reads it: the one place that says so.
STEP_KINDS: Final[Mapping[StepKind, KindRule]] = {
    StepKind.TASK: KindRule("task", ("params", "for_each", "channels"), _task_problems),
    StepKind.SWITCH: KindRule(
        "switch",
        ("cases", "default"),
        _switch_problems,
        takes_inputs=False,  # it reads only its value
        has_outputs=False,  # it chooses; it makes nothing
    ),
    StepKind.WORKFLOW: KindRule("sub-workflow", (), _workflow_problems),
}


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
            elif not STEP_KINDS[source.kind].has_outputs:
                noun = STEP_KINDS[source.kind].noun
                problems.append(
                    f"step {s.ref!r}: reads {read}, but {noun} {read.ref!r} has no outputs; read "
                    "the step its value comes from"
                )
        problems += [
            f"switch {s.ref!r}: case lists unknown step {ref!r}"
            for ref in s.cases
            if ref not in shapes
        ]
        if s.ref in s.cases:
            problems.append(f"switch {s.ref!r}: lists itself in its cases")
        if STEP_KINDS[s.kind].takes_inputs and not s.inputs_given:
            problems += _default_problems(s, shapes)
    graph = edges(shapes)
    problems += [
        f"dependency cycle: {' -> '.join(c)} (each step depends on the next)" for c in cycles(graph)
    ]
    problems += _stream_problems(shapes, graph)
    return problems


def stream_groups(publish: Mapping[str, Iterable[str]], subscribe: Mapping[str, Iterable[str]]
                  ) -> list[list[str]]:  # fmt: skip
    """The streaming groups: the steps joined (directly or not) by channels, each group's
    refs in the order given; ``publish`` and ``subscribe`` map a step's ref to its channels."""
    refs = list(dict.fromkeys([*publish, *subscribe]))
    users: dict[str, list[str]] = {}
    for ref in refs:
        for name in [*publish.get(ref, ()), *subscribe.get(ref, ())]:
            users.setdefault(name, []).append(ref)
    group_of: dict[str, int] = {}
    groups: list[set[str]] = []
    for ref in refs:
        if ref in group_of:
            continue
        index, todo, members = len(groups), [ref], {ref}
        while todo:
            current = todo.pop()
            group_of[current] = index
            for name in [*publish.get(current, ()), *subscribe.get(current, ())]:
                for peer in users[name]:
                    if peer not in members:
                        members.add(peer)
                        todo.append(peer)
        groups.append(members)
    return [[r for r in refs if r in g] for g in groups]


def _stream_problems(shapes: Mapping[str, Shape], graph: Mapping[str, list[str]]) -> list[str]:
    """A channel needs one publisher and a subscriber; the steps of a streaming group run at
    the same time, so none may wait for another's end."""
    publishers: dict[str, list[str]] = {}
    subscribers: dict[str, list[str]] = {}
    for s in shapes.values():
        for name in s.publish:
            publishers.setdefault(name, []).append(s.ref)
        for name in s.subscribe:
            subscribers.setdefault(name, []).append(s.ref)
    problems = []
    for name in sorted({*publishers, *subscribers}):
        writers, readers = publishers.get(name, []), subscribers.get(name, [])
        if len(writers) > 1:
            problems.append(
                f"channel {name!r}: published by {len(writers)} steps "
                f"({', '.join(map(repr, writers))}); a channel has one publisher"
            )
        if not writers:
            problems.append(
                f"channel {name!r}: step(s) {', '.join(map(repr, readers))} subscribe to it, "
                "but no step publishes it"
            )
        if not readers:
            problems.append(
                f"channel {name!r}: step {writers[0]!r} publishes it, but no step subscribes to it"
            )
    groups = stream_groups(
        {s.ref: s.publish for s in shapes.values() if s.publish},
        {s.ref: s.subscribe for s in shapes.values() if s.subscribe},
    )
    for group in groups:
        members = set(group)
        for ref in group:
            waits = _waits_on(ref, graph) & members
            if waits:
                problems.append(
                    f"step {ref!r}: waits for {', '.join(map(repr, sorted(waits)))} to end, but "
                    "the steps of a streaming group (joined by channels) run at the same time; "
                    "pass what it needs over a channel instead"
                )
    return problems


def _waits_on(ref: str, graph: Mapping[str, list[str]]) -> set[str]:
    """Every step ``ref`` waits for, directly or through others."""
    seen: set[str] = set()
    todo = list(graph.get(ref, []))
    while todo:
        current = todo.pop()
        if current not in seen:
            seen.add(current)
            todo.extend(graph.get(current, []))
    return seen


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
    dep = shapes.get(s.depends_on[0]) if s.depends_on else None
    if dep is not None and not STEP_KINDS[dep.kind].has_outputs:
        return [
            f"step {s.ref!r}: depends only on {STEP_KINDS[dep.kind].noun} {dep.ref!r}, which has "
            "no image; name its 'inputs', or depend on the step whose image it reads"
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
