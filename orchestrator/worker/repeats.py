"""Instructions a worker has run lately, so that one sent again is not run twice.

A scheduler sends an instruction again when Redis lost its data (its queue and the report
with it) or when no report came in time from a worker that still holds the object. Running it
twice would be wrong: the first run consumed its input object (handed it on, or destroyed it).
So a worker answers a repeat of an instruction it finished with the report it sent then, and
drops a repeat of one it is running now (that run's report answers both).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Final

from orchestrator.contract.messages import Instruction, Report

__all__ = ["RUNNING", "Repeats"]

RUNNING: Final = "running"
_KEEP: Final = 4096  # finished task runs remembered (a report is a few hundred bytes)


class Repeats:
    """Task runs started (and their reports once finished), newest last; safe across slots.

    Task run 0 (the no-op that asks an object back) is never remembered: it is sent for many
    objects and is harmless to repeat.
    """

    def __init__(self, keep: int = _KEEP) -> None:
        self._keep = keep
        self._lock = threading.Lock()
        self._runs: OrderedDict[tuple[int, int], Report | None] = OrderedDict()

    def begin(self, ins: Instruction) -> Report | str | None:
        """None for an instruction to run now (it is noted as running); ``RUNNING`` for one
        that runs already; the earlier report for one that finished."""
        if not ins.task_run_id:
            return None
        key = (ins.task_run_id, ins.attempt)
        with self._lock:
            if key in self._runs:
                report = self._runs[key]
                return RUNNING if report is None else report
            self._runs[key] = None
            while len(self._runs) > self._keep:
                self._runs.popitem(last=False)
        return None

    def finish(self, ins: Instruction, report: Report) -> None:
        if ins.task_run_id:
            with self._lock:
                self._runs[(ins.task_run_id, ins.attempt)] = report
