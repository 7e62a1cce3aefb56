"""Which worker a graph's step is bound to before it is ready: the one its inputs are handed
straight to (``instructions.sole_reader``).

A join reads what several steps make. The first of them sent chooses the join's worker (the
run's policy, on the loads it was sent with) and hands what it makes there; every other
one hands to the same worker, so that the join is pinned to one worker holding all of them.
*Why worked out from the run, not remembered:* the binding is whatever an instruction out
names (``hand_to``, or its own worker under ``keep``) or whichever worker holds an object
already handed on; a retry, a lost worker or a redrive changes those, and a record of its own
could disagree with them. A bound worker that died is still the answer: what was handed to it
comes back to the scheduler by the recovery rule, and a hand-on to it fails and comes back too,
so no two live workers ever hold the join's inputs.
"""

from __future__ import annotations

from orchestrator.scheduler.instructions import sole_reader
from orchestrator.scheduler.runs import RunState

__all__ = ["bound_worker"]


def bound_worker(scheduler_id: str, run: RunState, reader: str) -> str | None:
    """The worker ``reader``'s inputs already went (or go) to; None while none is chosen."""
    for obj in run.objects.values():
        producer = run.steps.get(obj.datum.partition(".")[0])
        if obj.owner == scheduler_id or producer is None:
            continue
        if sole_reader(run, producer) == reader:
            return obj.owner
    for step in run.steps.values():
        flight = step.in_flight
        if flight is None or sole_reader(run, step) != reader:
            continue
        ins = flight.instruction
        if ins.hand_to or ins.keep:
            return ins.hand_to or flight.worker
    return None
