"""A workflow definition as the graph that runs: every step's inputs resolved (the chain's
default made explicit), sub-workflows inlined, and who reads what.

``build_graph`` takes a definition's steps (validated) and a lookup of other definitions'
steps, and returns a ``Graph`` of ``Node``\\ s in an order where each comes after every node it
needs. A sub-workflow step ``enhance`` running ``image_pipeline`` becomes the nodes
``enhance/deblur``, ``enhance/denoise`` and ``enhance/classify``: the sub-workflow's
``input.<name>`` is the step's input of that name (or, if the step gives none, the run's own
``input.<name>``), and a later step's ``enhance.<output>`` reads that output of the
sub-workflow's last step that ran and produced it (its sinks, last first).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Final

from workflows.binding import IMAGE
from workflows.errors import InvalidDefinition
from workflows.steps import (
    INPUT,
    DataRef,
    StepKind,
    parse_ref,
    step_kind,
    stream_groups,
    topological,
)

__all__ = ["MAX_DEPTH", "SEP", "Graph", "Node", "build_graph"]

SEP: Final = "/"  # between a sub-workflow step's ref and its steps' refs
MAX_DEPTH: Final = 8  # sub-workflows inside sub-workflows, at most this deep

Lookup = Callable[[str], list[dict[str, Any]] | None]


@dataclass(frozen=True)
class Node:
    """One step that runs: a task, or a switch (``task`` None)."""

    ref: str
    task: str | None
    params: Mapping[str, Any] = field(default_factory=dict)
    # Parameter name -> the data it may read, in order: the first whose step ran and made it.
    inputs: Mapping[str, tuple[DataRef, ...]] = field(default_factory=dict)
    chain: bool = False  # the step named no inputs: it reads the single-image chain's image
    after: frozenset[str] = frozenset()  # every node that must end before this one starts
    for_each: str | None = None  # the input it runs once per element of
    switch: DataRef | None = None
    cases: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    default: tuple[str, ...] = ()
    publish: tuple[str, ...] = ()  # the channels a streaming step writes
    subscribe: tuple[str, ...] = ()  # the channels it reads

    @property
    def is_switch(self) -> bool:
        return self.task is None

    @property
    def chosen(self) -> frozenset[str]:
        """Every node a case of this switch runs."""
        return frozenset(r for refs in (*self.cases.values(), self.default) for r in refs)


@dataclass(frozen=True)
class Graph:
    nodes: Mapping[str, Node]  # in an order where each node comes after its ``after``

    @property
    def order(self) -> list[str]:
        return list(self.nodes)

    def successors(self, ref: str) -> list[str]:
        return [n.ref for n in self.nodes.values() if ref in n.after]

    def readers(self, ref: str, output: str) -> list[str]:
        """The nodes with an input that may read ``ref.output``."""
        want = DataRef(ref, output)
        return [n.ref for n in self.nodes.values()
                if n.ref != ref and any(want in a for a in n.inputs.values())]  # fmt: skip

    def read_outputs(self, ref: str) -> set[str]:
        """The outputs of ``ref`` that some node may read."""
        return {d.output for n in self.nodes.values() if n.ref != ref
                for a in n.inputs.values() for d in a if d.ref == ref}  # fmt: skip

    @property
    def sinks(self) -> list[str]:
        """The task nodes no other node waits for: their outputs are the run's results."""
        waited = {r for n in self.nodes.values() for r in n.after}
        return [n.ref for n in self.nodes.values() if not n.is_switch and n.ref not in waited]

    @cached_property
    def stream_groups(self) -> dict[str, tuple[str, ...]]:
        """Each streaming node's group: every node joined to it by channels (itself too),
        which the scheduler starts together."""
        groups = stream_groups(
            {n.ref: n.publish for n in self.nodes.values() if n.publish},
            {n.ref: n.subscribe for n in self.nodes.values() if n.subscribe},
        )
        return {ref: tuple(group) for group in groups for ref in group}

    def channel_plan(self, ref: str) -> dict[str, dict[str, Any]]:
        """What node ``ref``'s instruction says of its channels: each channel it publishes
        with the nodes that subscribe to it, each it subscribes to with its publisher."""
        node = self.nodes[ref]
        if not node.publish and not node.subscribe:
            return {}
        others = [n for n in self.nodes.values() if n.ref != ref]
        return {
            "publish": {
                name: [n.ref for n in others if name in n.subscribe] for name in node.publish
            },
            "subscribe": {
                name: next((n.ref for n in others if name in n.publish), "")
                for name in node.subscribe
            },
        }

    @cached_property
    def is_chain(self) -> bool:
        """One line of task steps, each reading the one before it: the single-image
        pipeline, which the fast paths (held images, one object moving along) are for (the
        graph never changes: worked out once)."""
        refs = list(self.nodes)
        for i, node in enumerate(self.nodes.values()):
            before = {refs[i - 1]} if i else set()
            if node.is_switch or node.for_each or node.after != before:
                return False
        return True


def build_graph(steps: Iterable[Mapping[str, Any]], lookup: Lookup, *, depth: int = 0) -> Graph:
    """The graph of validated ``steps``; ``lookup(name)`` gives another definition's steps
    (None: there is none). ``InvalidDefinition`` for what only shows when sub-workflows are
    inlined (one missing, or nested deeper than ``MAX_DEPTH``, as by recursion)."""
    listed = list(steps)
    kinds = {s["ref"]: s for s in listed}
    expanded: dict[str, tuple[list[str], list[str]]] = {}  # sub step -> (its nodes, its sinks)
    nodes: dict[str, Node] = {}
    for step in listed:
        if step_kind(step) is not StepKind.WORKFLOW:
            nodes[step["ref"]] = _node(step, kinds)  # a task, or a switch (no task)
            continue
        inner = _sub_graph(step, kinds, lookup, depth)  # its definition's nodes, inlined
        expanded[step["ref"]] = (list(inner), [n.ref for n in inner.values() if _is_sink(n, inner)])
        nodes.update(inner)
    if expanded:
        nodes = {ref: _through_subs(n, expanded) for ref, n in nodes.items()}
    order = topological({ref: sorted(n.after) for ref, n in nodes.items()})
    return Graph({ref: nodes[ref] for ref in order})


def _default_inputs(step: Mapping[str, Any]) -> dict[str, tuple[DataRef, ...]]:
    """The single-image chain: the image of the one step it depends on, or the input's."""
    deps = list(step.get("depends_on") or [])
    return {IMAGE: (DataRef(deps[0] if deps else INPUT, IMAGE),)}


def _switches_listing(ref: str, kinds: Mapping[str, Mapping[str, Any]]) -> set[str]:
    """The switches whose cases run ``ref`` (they end before it starts)."""
    found = set()
    for other in kinds.values():
        cases = [*(other.get("cases") or {}).values(), other.get("default") or []]
        if other["ref"] != ref and ref in {r for refs in cases for r in refs}:
            found.add(other["ref"])
    return found


def _node(step: Mapping[str, Any], kinds: Mapping[str, Mapping[str, Any]]) -> Node:
    given = step.get("inputs")
    is_switch = step_kind(step) is StepKind.SWITCH
    if is_switch:
        inputs: dict[str, tuple[DataRef, ...]] = {}  # a switch reads only its value
    elif given is None:
        inputs = _default_inputs(step)
    else:
        inputs = {name: _alternatives(value) for name, value in given.items()}
    after = set(step.get("depends_on") or [])
    after |= {d.ref for refs in inputs.values() for d in refs if d.ref != INPUT}
    switch = parse_ref(step[StepKind.SWITCH]) if is_switch else None
    if switch is not None:
        after.add(switch.ref)
    after |= _switches_listing(step["ref"], kinds)
    return Node(
        ref=step["ref"],
        task=step.get("task"),
        params=dict(step.get("params") or {}),
        inputs=inputs,
        chain=given is None and switch is None,
        after=frozenset(after),
        for_each=step.get("for_each"),
        switch=switch,
        cases={k: tuple(v) for k, v in (step.get("cases") or {}).items()},
        default=tuple(step.get("default") or ()),
        publish=tuple((step.get("channels") or {}).get("publish", ())),
        subscribe=tuple((step.get("channels") or {}).get("subscribe", ())),
    )


def _alternatives(value: str | list[str]) -> tuple[DataRef, ...]:
    texts = value if isinstance(value, list) else [value]
    refs = [parse_ref(t) for t in texts]
    return tuple(r for r in refs if r is not None)


def _is_sink(node: Node, nodes: Mapping[str, Node]) -> bool:
    return not node.is_switch and not any(node.ref in n.after for n in nodes.values())


def _sub_graph(
    step: Mapping[str, Any], kinds: Mapping[str, Mapping[str, Any]], lookup: Lookup, depth: int
) -> dict[str, Node]:
    """The nodes of sub-workflow step ``step``, renamed under its ref and reading its inputs."""
    name, ref = step["workflow"], step["ref"]
    if depth >= MAX_DEPTH:
        raise InvalidDefinition(
            [f"step {ref!r}: sub-workflows nest deeper than {MAX_DEPTH} (does {name!r} run "
             "itself through another?)"], "workflow")  # fmt: skip
    sub_steps = lookup(name)
    if sub_steps is None:
        raise InvalidDefinition([f"step {ref!r}: workflow {name!r} is gone"], "workflow")
    inner = build_graph(sub_steps, lookup, depth=depth + 1)
    given = step.get("inputs")
    outer = (
        _default_inputs(step) if given is None else {n: _alternatives(v) for n, v in given.items()}
    )
    before = set(step.get("depends_on") or []) | _switches_listing(ref, kinds)
    before |= {d.ref for refs in outer.values() for d in refs if d.ref != INPUT}

    def rename(r: str) -> str:
        return f"{ref}{SEP}{r}"

    def reread(d: DataRef) -> tuple[DataRef, ...]:
        if d.ref != INPUT:
            return (DataRef(rename(d.ref), d.output),)
        return outer.get(d.output, (d,))  # not given by the step: the run's own input

    nodes: dict[str, Node] = {}
    for node in inner.nodes.values():
        inputs = {n: tuple(x for d in alts for x in reread(d)) for n, alts in node.inputs.items()}
        after = {rename(r) for r in node.after}
        if not node.after:
            after |= before
        after |= {d.ref for alts in inputs.values() for d in alts if d.ref != INPUT}
        nodes[rename(node.ref)] = replace(
            node,
            ref=rename(node.ref),
            inputs=inputs,
            after=frozenset(after),
            switch=None if node.switch is None else reread(node.switch)[0],
            cases={k: tuple(map(rename, v)) for k, v in node.cases.items()},
            default=tuple(map(rename, node.default)),
            publish=tuple(map(rename, node.publish)),  # the run's channels are per sub-step
            subscribe=tuple(map(rename, node.subscribe)),
        )
    return nodes


def _through_subs(node: Node, expanded: Mapping[str, tuple[list[str], list[str]]]) -> Node:
    """``node`` with every reference to a sub-workflow step turned into its nodes: an output
    read from its sinks (last first), waiting for all of its nodes."""

    def reread(d: DataRef) -> tuple[DataRef, ...]:
        if d.ref not in expanded:
            return (d,)
        return tuple(DataRef(s, d.output) for s in reversed(expanded[d.ref][1]))

    def members(refs: Iterable[str]) -> tuple[str, ...]:
        out: list[str] = []
        for r in refs:
            out.extend(expanded[r][0] if r in expanded else [r])
        return tuple(out)

    if not any(r in expanded for r in (*node.after, *node.chosen)):
        return node
    inputs = {n: tuple(x for d in alts for x in reread(d)) for n, alts in node.inputs.items()}
    return replace(
        node,
        inputs=inputs,
        after=frozenset(members(node.after)),
        switch=None if node.switch is None else reread(node.switch)[0],
        cases={k: members(v) for k, v in node.cases.items()},
        default=members(node.default),
    )
