"""Firing schedules: the scheduler looks for due ticks when the earliest one is due, and makes
their runs (``db.schedule_store``: a row lock per schedule, one transaction, each tick's run
once however many schedulers look). The runs it makes are claimed like any other, at once.

*When it looks:* at the earliest ``next_fire_at`` of any active schedule (the loop's tick is
brought forward to it), when a schedule changed (a ``schedules`` wake-up) and at least every
``RECHECK_S`` (a schedule made through another API process whose wake-up went to another
scheduler, or was lost). Between those it costs nothing.
"""

from __future__ import annotations

import logging
import time
from typing import Final

from orchestrator.db.schedule_store import ScheduleStore
from orchestrator.scheduler.claims import Claims
from orchestrator.scheduler.context import NextTick

__all__ = ["RECHECK_S", "Schedules"]

log = logging.getLogger(__name__)

RECHECK_S: Final = 10.0
_SOONEST_S: Final = 0.05  # a tick due but locked by another scheduler: look again after this
_AGAIN_S: Final = 1.0  # after a look that failed


class Schedules:
    """The schedules' side of one scheduler's loop."""

    def __init__(self, store: ScheduleStore, claims: Claims, tick: NextTick) -> None:
        self.store = store
        self.claims = claims
        self._tick = tick  # brought forward to the next look
        self._look_at = 0.0  # monotonic

    def changed(self) -> None:
        """A schedule was made, changed or resumed: look now."""
        self._look_at = 0.0

    def tick(self) -> None:
        """Make the runs of due ticks, if it is time to look."""
        now = time.monotonic()
        if now < self._look_at:
            return
        self._look_at = now + _AGAIN_S  # if the look raises, look again soon
        fired = self.store.fire_due()
        self._look_at = now + RECHECK_S
        if fired.next_due_s is not None and fired.next_due_s < RECHECK_S:
            self._look_at = now + max(_SOONEST_S, fired.next_due_s)
            self._tick.by(self._look_at)
        if fired.runs:
            log.info("schedules made %d run(s)", fired.runs)
            self.claims.claim()
