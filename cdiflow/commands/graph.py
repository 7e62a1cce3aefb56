"""How the commands draw a workflow definition's steps: one line a step, in an order where each
comes after the steps it waits for, saying what it is and which steps those are.

The edges are the ones the scheduler runs by (``workflows.steps``): ``depends_on``, every step an
input or a switch reads, and a switch before the steps of its cases. A step of a kind this
version does not know is drawn with the fields it has.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from workflows.steps import (
    STEP_KEYS,
    Shape,
    StepKind,
    edges,
    step_kind,
    step_problems,
    topological,
)

__all__ = ["Graph"]


class Graph:
    """The steps of one definition (as the API answers them: JSON objects) and their edges."""

    def __init__(self, steps: Sequence[Mapping[str, Any]]) -> None:
        self.steps = {str(s.get("ref")): s for s in steps}
        shapes: dict[str, Shape] = {}
        for i, step in enumerate(steps):
            step_problems(i, step, set(), None, shapes)  # only the shapes: it is stored, valid
        graph = edges(shapes)
        self.after = {ref: graph.get(ref, []) for ref in self.steps}
        try:
            self.order = topological(self.after)
        except ValueError:  # edges of a kind this version does not know: the stored order
            self.order = list(self.steps)

    def summary(self) -> str:
        """One line: a chain as ``a -> b -> c``, else how many steps and what the graph has."""
        followers = {ref: [r for r in self.order if ref in self.after[r]] for ref in self.order}
        kinds = [_kind(s) for s in self.steps.values()]
        fans_out = any(s.get("for_each") for s in self.steps.values())
        chain = all(self.after[r] == self.order[i - 1 : i] for i, r in enumerate(self.order))
        if chain and set(kinds) <= {StepKind.TASK} and not fans_out:
            return " -> ".join(self.order)
        starts = [r for r in self.order if not self.after[r]]
        has = [
            name
            for name, present in (
                (f"{len(starts)} starting steps", len(starts) > 1),
                ("fork", any(len(f) > 1 for f in followers.values())),
                ("join", any(len(a) > 1 for a in self.after.values())),
                ("switch", StepKind.SWITCH in kinds),
                ("for_each", fans_out),
                ("sub-workflow", StepKind.WORKFLOW in kinds),
            )
            if present
        ]
        has += sorted({k for k in kinds if k not in tuple(StepKind)})
        return f"{len(self.steps)} steps: {', '.join(has)}"

    def rows(self) -> list[tuple[str, str, str]]:
        """Each step in run order: its ref, the steps it comes after, and what it is."""
        return [
            (ref, ", ".join(self.after[ref]) or "-", _describe(self.steps[ref]))
            for ref in self.order
        ]


def _kind(step: Mapping[str, Any]) -> StepKind | str:
    """The step's ``StepKind``, or the first field this version does not know (a kind a
    later one added)."""
    kind = step_kind(step)
    if kind is not None:
        return kind
    unknown = [k for k in step if k not in STEP_KEYS]
    return unknown[0] if unknown else StepKind.TASK


def _switch(step: Mapping[str, Any]) -> str:
    cases = step.get("cases") or {}
    choices = [f"{value} -> {', '.join(refs)}" for value, refs in cases.items()]
    if step.get("default"):
        choices.append(f"otherwise {', '.join(step['default'])}")
    return f"switch on {step['switch']}: {'; '.join(choices)}"


# What each kind of step is drawn as.
_DRAWN: Final[Mapping[StepKind, Callable[[Mapping[str, Any]], str]]] = {
    StepKind.TASK: lambda step: f"task {step.get('task')}",
    StepKind.SWITCH: _switch,
    StepKind.WORKFLOW: lambda step: f"sub-workflow {step['workflow']}",
}


def _describe(step: Mapping[str, Any]) -> str:
    kind = _kind(step)
    if isinstance(kind, StepKind):
        what = _DRAWN[kind](step)
    else:
        what = "a step of a kind this cdiflow does not know:"
    inputs = step.get("inputs") or {}
    if inputs:
        given = [f"{n}={'|'.join(v) if isinstance(v, list) else v}" for n, v in inputs.items()]
        what += f", reads {', '.join(given)}"
    if step.get("for_each"):
        what += f", once per element of {step['for_each']}"
    channels = step.get("channels") or {}
    for role, verb in (("publish", "publishes"), ("subscribe", "subscribes to")):
        if channels.get(role):
            what += f", streaming: {verb} {', '.join(channels[role])}"
    if step.get("params"):
        what += f", params {_compact(step['params'])}"
    unknown = {k: v for k, v in step.items() if k not in STEP_KEYS}
    if unknown:
        what += " " + ", ".join(f"{k}={_compact(v)}" for k, v in unknown.items())
    return what


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), default=str)
