"""How a run moves through its graph: which step runs may start once others have ended, which
are skipped, what a switch chooses, how a step that runs per element fans out, and which
objects no read is left for. Pure bookkeeping on a ``RunState``: no I/O.

*When a node starts:* once every node before it (``Node.after``) has ended. It is then
SKIPPED if a switch it follows chose another case (or was itself skipped), if everything
before it was skipped, or if an input has nothing to read because the steps it could read
from were skipped; otherwise each input takes the first of its alternatives whose step ran and
made that output, and the node is ready. A node that runs per element of an input becomes one
step run per element (``"<ref>[<i>]"``), each reading its element, and ends once they all have.

*Reads of an object* (``Obj.pending``): when a step makes an object, every node that may read
it reserves a read; a node that reads another alternative, or is skipped, gives its
reservation back; one that fans out into n runs reserves n - 1 more. Each read reported gives
one back. An object with no read left and none going on is freed (``Moves.freed``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from cdi import ObjectKey
from orchestrator.scheduler.data import Datum, Obj
from orchestrator.scheduler.runs import Phase, RunState, StepRun
from workflows.binding import IMAGE
from workflows.graph import Node
from workflows.steps import INPUT, DataRef

__all__ = ["Moves", "done", "read_done", "rewind", "settle", "skip_all"]

_ENDED = (Phase.DONE, Phase.SKIPPED)


@dataclass
class Moves:
    """What a turn of progress made possible, for the scheduler to act on and record."""

    ready: list[StepRun] = field(default_factory=list)  # to place
    skipped: list[StepRun] = field(default_factory=list)  # to record as SKIPPED
    switched: list[tuple[StepRun, dict[str, Any]]] = field(default_factory=list)  # evaluated
    freed: list[Obj] = field(default_factory=list)  # no read left: destroy (or ask back)
    failure: str = ""  # the run cannot go on: why


def settle(run: RunState, moves: Moves | None = None) -> Moves:
    """Start every node whose predecessors have all ended (repeatedly: a skip or a switch
    can end further nodes at once)."""
    moves = moves if moves is not None else Moves()
    progressed = True
    while progressed and not moves.failure:
        progressed = False
        for step in list(run.steps.values()):
            if step.phase is not Phase.WAITING or step.index is not None:
                continue
            if all(run.steps[r].phase in _ENDED for r in step.node.after):
                _start(run, step, moves)
                progressed = True
    return moves


def done(
    run: RunState,
    step: StepRun,
    made: dict[str, Datum],
    output: dict[str, Any],
    moves: Moves | None = None,
) -> Moves:
    """``step`` completed, having made ``made`` (its object outputs) and ``output`` (JSON)."""
    moves = moves if moves is not None else Moves()
    step.phase = Phase.DONE
    step.in_flight = None
    run.outputs[step.id] = output
    data = {name: Datum(value=value) for name, value in output.items()}
    data.update(made)
    run.made[step.id] = data
    readers = _reader_counts(run, step.node.ref)
    for name, datum in made.items():
        for key in datum.object_keys():
            obj = run.objects.get(key)
            if obj is not None:
                obj.pending += readers.get(name, 0)
                if obj.unused:
                    moves.freed.append(run.objects.pop(key))
    if step.index is not None:
        _maybe_fan_in(run, step.node.ref)
    return settle(run, moves)


def _reader_counts(run: RunState, ref: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in run.graph.nodes.values():
        if node.ref == ref:
            continue  # the step that fetches the input image reads ``input.image`` too
        for name in {d.output for alts in node.inputs.values() for d in alts if d.ref == ref}:
            counts[name] = counts.get(name, 0) + 1
    return counts


def read_done(run: RunState, key: ObjectKey, worker: str, moves: Moves) -> None:
    """A shared read of ``key`` by ``worker`` was reported."""
    obj = run.objects.get(key)
    if obj is None:
        return
    obj.read_done(worker)
    if obj.unused:
        moves.freed.append(run.objects.pop(key))


def skip_all(run: RunState) -> list[StepRun]:
    """Every step run not ended yet (the run ends): they are neither placed nor recorded."""
    return [s for s in run.steps.values() if s.phase not in _ENDED]


def rewind(run: RunState, obj: Obj, reader: StepRun | None = None) -> list[StepRun]:
    """The image its owner held, newer than ``obj``, is lost: the step runs that made it run
    again from ``obj`` (which goes back to standing for the datum the first of them read);
    the step runs that go back to waiting. ``reader``, the step that was reading the image,
    waits again too. Every attempt made again counts as lost (``StepRun.lost``): the image
    died with its worker, not by a fault of those steps."""
    chain = [run.steps[i] for i in obj.held_chain if i in run.steps]
    base_step, base_name = obj.held_base
    run.made.setdefault(base_step, {})[base_name] = Datum(key=obj.key, kind=obj.kind)
    obj.held, obj.held_chain, obj.held_base, obj.pending = "", (), ("", ""), 1
    for step in chain:
        run.made.pop(step.id, None)
        run.outputs.pop(step.id, None)
    for step in [*chain, reader] if reader is not None else chain:
        step.phase = Phase.WAITING
        step.reads = {}
        step.attempt = run.attempts.get(step.id, step.attempt) + 1
        step.lost += 1
    return chain


# ---------------------------------------------------------------------- starting a node
def _start(run: RunState, step: StepRun, moves: Moves) -> None:
    node = step.node
    if _skipped(run, node):
        _skip(run, step, moves)
        return
    if node.is_switch:
        _switch(run, step, moves)
        return
    reads, why = _resolve(run, node)
    if why:
        moves.failure = why
        return
    if reads is None:
        _skip(run, step, moves)
        return
    _give_back_others(run, node, reads, moves)
    if node.for_each is not None:
        _fan_out(run, step, reads, moves)
        return
    step.reads = reads
    step.phase = Phase.READY
    moves.ready.append(step)


def _skipped(run: RunState, node: Node) -> bool:
    for ref in node.after:
        before = run.steps[ref]
        if before.node.is_switch and node.ref in before.node.chosen:
            taken = run.made.get(ref, {}).get("runs")
            if before.phase is Phase.SKIPPED or taken is None or node.ref not in taken.value:
                return True
    return bool(node.after) and all(run.steps[r].phase is Phase.SKIPPED for r in node.after)


def _skip(run: RunState, step: StepRun, moves: Moves) -> None:
    step.phase = Phase.SKIPPED
    moves.skipped.append(step)
    _give_back_others(run, step.node, {}, moves)


def _switch(run: RunState, step: StepRun, moves: Moves) -> None:
    node = step.node
    assert node.switch is not None
    datum = _made(run, node.switch)
    if datum is None:
        moves.failure = (
            f"switch {node.ref!r} reads {node.switch}, which step {node.switch.ref!r} did not "
            "make; it must be a JSON value of that step's output"
        )
        return
    if datum.is_object or datum.items is not None:
        moves.failure = f"switch {node.ref!r}: {node.switch} is not a JSON value to compare"
        return
    value = datum.value
    text = value if isinstance(value, str) else json.dumps(value)
    case = text if text in node.cases else None
    taken = node.cases[case] if case is not None else node.default
    step.phase = Phase.DONE
    result = {"value": value, "case": case, "runs": list(taken)}
    run.made[step.id] = {"runs": Datum(value=list(taken))}
    run.outputs[step.id] = result
    moves.switched.append((step, result))


def _made(run: RunState, ref: DataRef) -> Datum | None:
    """What ``ref`` names, if its step made it (a fanned-out node: the list of its runs')."""
    if ref.ref == INPUT:
        made = run.made.get(INPUT, {}).get(ref.output)
        if made is not None:
            return made
        if ref.output == IMAGE:
            return Datum(uri=run.input_uri) if run.input_uri else None
        return Datum(value=run.data[ref.output]) if ref.output in run.data else None
    runs = run.fanned.get(ref.ref)
    if runs is None:
        return run.made.get(ref.ref, {}).get(ref.output)
    items = [run.made.get(i, {}).get(ref.output) for i in runs]
    if any(item is None for item in items):
        return None
    return Datum(items=tuple(i for i in items if i is not None))


def _resolve(run: RunState, node: Node) -> tuple[dict[str, Datum] | None, str]:
    """``node``'s inputs (None: one has nothing to read, as its steps were skipped), or why
    the run cannot go on."""
    reads: dict[str, Datum] = {}
    for name, alternatives in node.inputs.items():
        found = None
        for ref in alternatives:
            found = _made(run, ref)
            if found is not None:
                break
        if found is not None:
            reads[name] = found
            continue
        if node.chain and name == IMAGE:
            continue  # a run started without an image: the task gets none (``binding``)
        if all(r.ref != INPUT and run.steps[r.ref].phase is Phase.SKIPPED for r in alternatives):
            return None, ""
        return None, _missing(run, node, name, alternatives)
    return reads, ""


def _missing(run: RunState, node: Node, name: str, alternatives: Iterable[DataRef]) -> str:
    said = " or ".join(map(str, alternatives))
    for ref in alternatives:
        if ref.ref == INPUT:
            what = "image" if ref.output == IMAGE else f"input.data has no {ref.output!r}"
            if ref.output == IMAGE:
                return f"step {node.ref!r} reads {said}, but the run was started without an {what}"
            return f"step {node.ref!r} reads {said}, but the run's {what}"
    made = sorted({n for r in alternatives for i in _runs_of(run, r.ref)
                   for n in run.made.get(i, {})})  # fmt: skip
    return (
        f"step {node.ref!r} reads {said} (input {name!r}), which no step made "
        f"(they made: {', '.join(made) or 'nothing'}); name an output the task returns"
    )


def _runs_of(run: RunState, ref: str) -> list[str]:
    return run.fanned.get(ref, [ref])


def _give_back_others(run: RunState, node: Node, reads: dict[str, Datum], moves: Moves) -> None:
    """Give back the reservations of every datum ``node`` may read but does not."""
    kept = {k for d in reads.values() for k in d.object_keys()}
    seen: set[str] = set()
    for alternatives in node.inputs.values():
        for ref in alternatives:
            if ref.ref == INPUT:
                continue
            datum = _made(run, ref)
            for key in () if datum is None else datum.object_keys():
                if key in kept or key in seen:
                    continue
                seen.add(key)
                obj = run.objects.get(key)
                if obj is not None:
                    obj.pending -= 1
                    if obj.unused:
                        moves.freed.append(run.objects.pop(key))


def _fan_out(run: RunState, step: StepRun, reads: dict[str, Datum], moves: Moves) -> None:
    node = step.node
    assert node.for_each is not None
    listed = reads[node.for_each]
    if listed.items is None:
        items: tuple[Datum, ...] | None = None
        if not listed.is_object and isinstance(listed.value, list):
            items = tuple(Datum(value=v) for v in listed.value)
        if items is None:
            moves.failure = (
                f"step {node.ref!r} runs for each element of input {node.for_each!r}, which is "
                "not a list"
            )
            return
        listed = Datum(items=items)
    ids = [f"{node.ref}[{i}]" for i in range(len(listed.items or ()))]
    run.fanned[node.ref] = ids
    shared = {k for n, d in reads.items() if n != node.for_each for k in d.object_keys()}
    for key in shared:
        obj = run.objects.get(key)
        if obj is not None:
            obj.pending += len(ids) - 1
            if obj.unused:
                moves.freed.append(run.objects.pop(key))
    step.phase = Phase.FANNED if ids else Phase.DONE
    if not ids:
        run.made[step.id] = {}
        run.outputs[step.id] = {}
        return
    for i, (element_id, element) in enumerate(zip(ids, listed.items or (), strict=True)):
        element_run = StepRun(
            element_id,
            node,
            step.spec,
            index=i,
            phase=Phase.READY,
            attempt=run.attempts.get(element_id, 0) + 1,
            reads={**reads, node.for_each: element},
        )
        run.steps[element_id] = element_run
        moves.ready.append(element_run)


def _maybe_fan_in(run: RunState, ref: str) -> None:
    """A fanned-out node is done once every one of its runs is."""
    ids = run.fanned.get(ref, [])
    if all(run.steps[i].phase is Phase.DONE for i in ids):
        node_run = run.steps[ref]
        node_run.phase = Phase.DONE
        run.made[ref] = {}
        run.outputs[ref] = {}
