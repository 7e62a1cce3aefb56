"""The API's background work on Postgres: the tallies folded every second, per-minute ones
older than two days dropped, and a retention pass every ``CDIFLOW_RETENTION_INTERVAL_S``.

Every API replica runs it; advisory locks make one fold and one pruning batch run at a time
(``db.tallies.FOLD``, ``db.retention.LOCK``). Two threads, so that a long retention pass (a
backlog of a million runs) never holds the folding back.
"""

from __future__ import annotations

import logging
from typing import Final

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from orchestrator.controller.background import Background
from orchestrator.db import tallies
from orchestrator.retention import Pruner
from orchestrator.settings import Settings

__all__ = ["FOLD_EVERY_S", "Housekeeping"]

log = logging.getLogger(__name__)

FOLD_EVERY_S: Final = 1.0


class Housekeeping:
    """``start()`` at the API's start-up, ``close()`` at its shutdown."""

    def __init__(self, engine: Engine, settings: Settings) -> None:
        self._engine = engine
        self._interval_s = settings.retention_interval_s
        self._background = Background(
            {"tally-fold": self._folding, "retention": self._pruning}, join_s=10.0
        )
        self._stop = self._background.stop
        self.pruner = Pruner(engine, settings, stop=self._stop)

    def start(self) -> None:
        self._background.start()

    def close(self) -> None:
        self._background.close()

    def fold(self) -> int:
        """Move the tallies' deltas into place; how many rows that wrote."""
        return tallies.fold_all(self._engine, stop=self._stop)

    def _folding(self) -> None:
        while not self._stop.wait(FOLD_EVERY_S):
            try:
                self.fold()
            except SQLAlchemyError as exc:  # Postgres away: the deltas wait, readers add them
                log.debug("tallies not folded: %s", exc)

    def _pruning(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                with self._engine.connect() as conn, conn.begin():
                    conn.execute(tallies.PRUNE_MINUTES, {"keep": tallies.KEEP_MINUTES})
            except SQLAlchemyError as exc:
                log.warning("old per-minute tallies not dropped: %s", exc)
            self.pruner.run_pass()
