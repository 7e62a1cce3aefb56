"""Retention: finished runs are kept for a number of days from their end, then pruned, in
small batches, optionally archived to S3 first.

The policy is per definition (``PUT /api/workflow-definitions/{name}/retention``), else the
settings' default (``CDIFLOW_RETENTION_DAYS``, 30; 0 keeps runs for ever). What pruning does
to a run's results in S3 is part of it: ``keep`` (the default) or ``delete``
(``CDIFLOW_RETENTION_RESULTS``). A pruned run takes with it its task runs, hand-offs, events,
its webhook deliveries that are done (a PENDING one stays, to be sent) and its
``Idempotency-Key`` (a start with that key then starts a new run). With ``CDIFLOW_ARCHIVE_URI``
set, each batch's runs — the run and all of those, as stored — are written there first as
gzipped JSON lines, one line per run, one object per batch (``<prefix>YYYY/MM/DD/<HHMMSS>-
<first id>.jsonl.gz``, by the end of its oldest run; the same batch again writes the same
object). A run
is deleted only after its archive is written and its results are gone: a failure leaves it for
the next pass.

*Why batches, paced, between runs:* a batch is one short transaction over a few dozen runs
that nothing else uses (finished runs; the scheduler's statements never wait for it). After
each the pruner pauses twice as long as the batch took (so a large backlog, a million runs when
retention is first turned on, takes at most a third of one core from the scheduler's Postgres),
and while any run is pending or running (the kept counts by status) it waits for a moment with
none, up to a second, before the next batch: a workflow that runs meets at most the rest of one
short batch, and pruning still moves on under constant load (a batch a second at least). Its
commits wait for the WAL to reach disk (``synchronous_commit`` as the server has it): a batch's
deletions are flushed by the pruner's own commit, not by the next running workflow's commit that
would otherwise find them unflushed ahead of its own.
References: Temporal's namespace retention (closed runs deleted after a period per namespace,
archived to a blob store first if enabled) and Conductor's archival (a finished workflow
moved out of the primary store).
"""

from __future__ import annotations

import gzip
import logging
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

from sqlalchemy import Engine, text
from sqlalchemy.exc import SQLAlchemyError

from orchestrator.contract.vocabulary import ResultRetention, WorkflowStatus
from orchestrator.db import retention as sql
from orchestrator.db import tallies
from orchestrator.errors import OrchestratorError
from orchestrator.objectstore import ObjectStore
from orchestrator.settings import Settings

__all__ = ["BATCH", "QUIET_WAIT_S", "PassReport", "Pruner", "RetentionPolicy"]

log = logging.getLogger(__name__)

BATCH: Final = 25  # runs per transaction
_PAUSE: Final = 2.0  # after a batch, this many times as long as it took
_MIN_PAUSE_S: Final = 0.01
QUIET_WAIT_S: Final = 1.0  # at most this long between batches for a moment with no run going
_QUIET_POLL_S: Final = 0.05
_GOING: Final = (WorkflowStatus.PENDING, WorkflowStatus.RUNNING)
_ELSEWHERE: Final = (-1, -1, -1)  # a batch another pruner holds the lock for


@dataclass(frozen=True)
class RetentionPolicy:
    """What retention does to one definition's runs."""

    days: int  # 0: kept for ever
    results: ResultRetention


@dataclass(frozen=True)
class PassReport:
    pruned: int
    archived: int
    results_deleted: int
    seconds: float
    error: str | None = None
    yielded_s: float = 0.0  # of ``seconds``, waiting for runs going to end


class Pruner:
    """Runs retention passes (``run_pass``) on ``engine``; S3 through ``store`` (made when an
    archive or a deletion of results first needs it)."""

    def __init__(
        self,
        engine: Engine,
        settings: Settings,
        *,
        store: ObjectStore | None = None,
        batch: int = BATCH,
        quiet_wait_s: float = QUIET_WAIT_S,
        stop: threading.Event | None = None,
    ) -> None:
        self._engine = engine
        self._settings = settings
        self._store = store
        self._batch = batch
        self._quiet_wait_s = quiet_wait_s
        self._stop = stop or threading.Event()

    @property
    def default(self) -> RetentionPolicy:
        return RetentionPolicy(self._settings.retention_days, self._settings.retention_results)

    def store(self) -> ObjectStore:
        if self._store is None:
            self._store = ObjectStore(self._settings, enforce=True)
        return self._store

    def run_pass(self) -> PassReport:
        """Prune what every definition's policy lets go, batch by batch, until nothing is
        left or ``stop`` is set; the pass is recorded (``retention_state``)."""
        began = time.monotonic()
        pruned = archived = deleted = 0
        yielded = 0.0
        error: str | None = None
        try:
            with self._engine.connect() as conn:
                found = sql.policies(conn)
                now = conn.scalar(text("SELECT now()"))
                conn.commit()
            for own in found:
                policy = RetentionPolicy(
                    own.days if own.days is not None else self.default.days,
                    own.results or self.default.results,
                )
                if policy.days <= 0:
                    continue
                cutoff = now - timedelta(days=policy.days)
                while not self._stop.is_set():
                    if pruned:  # (between batches: the first goes at once)
                        yielded += self._until_quiet()
                    batch_began = time.monotonic()
                    done = self._batch_of(own.name, cutoff, policy)
                    if done is None:
                        break
                    if done is _ELSEWHERE:  # another API replica prunes: its pass, its record
                        took = time.monotonic() - began
                        return PassReport(pruned, archived, deleted, took, yielded_s=yielded)
                    pruned += done[0]
                    archived += done[1]
                    deleted += done[2]
                    pause = max(_MIN_PAUSE_S, _PAUSE * (time.monotonic() - batch_began))
                    if self._stop.wait(pause):
                        break
        except (OrchestratorError, SQLAlchemyError, OSError, ValueError) as exc:
            # Recorded (``GET /api/retention``, ``cdiflow status``); the next pass tries again.
            error = f"{type(exc).__name__}: {exc}"
            log.warning("retention pass stopped: %s", error)
        seconds = time.monotonic() - began
        self._record(pruned, seconds, error)
        if pruned:
            log.info("retention pruned %d finished runs in %.1f s (%.1f s waiting for runs "
                     "going to end)", pruned, seconds, yielded)  # fmt: skip
        return PassReport(pruned, archived, deleted, seconds, error, yielded)

    def _until_quiet(self) -> float:
        """Wait while runs are pending or running, up to ``quiet_wait_s``; the seconds
        waited."""
        began = time.monotonic()
        while time.monotonic() - began < self._quiet_wait_s and not self._stop.is_set():
            with self._engine.connect() as conn:
                going = tallies.counts(conn, "workflows:")
                conn.commit()
            if not any(going.get(s, 0) for s in _GOING):
                break
            self._stop.wait(_QUIET_POLL_S)
        return time.monotonic() - began

    def _batch_of(
        self, definition: str, cutoff: datetime, policy: RetentionPolicy
    ) -> tuple[int, int, int] | None:
        """One batch of ``definition``'s runs ended before ``cutoff``: (pruned, archived,
        results deleted), ``None`` when there is none, ``_ELSEWHERE`` when another pruner
        holds the lock."""
        with self._engine.connect() as conn, conn.begin():
            if not conn.scalar(text(f"SELECT pg_try_advisory_xact_lock({sql.LOCK})")):
                return _ELSEWHERE
            victims = sql.take_batch(conn, definition, cutoff, self._batch)
            if not victims:
                return None
            ids = [v.id for v in victims]
            archive = self._settings.archive_uri
            if archive:
                self._archive(archive, victims[0], sql.archive_lines(conn, ids))
            uris: list[str] = []
            if policy.results is ResultRetention.DELETE:
                uris = sql.result_uris(conn, ids, self.store().policy.results)
                if uris:
                    self.store().delete_many(uris)
            gone = sql.delete_batch(conn, ids, archived=bool(archive))
        return gone, gone if archive else 0, len(uris)

    def _archive(self, prefix: str, oldest: sql.Victim, lines: list[str]) -> None:
        at = oldest.finished_at
        uri = f"{prefix}{at:%Y/%m/%d}/{at:%H%M%S}-{oldest.id}.jsonl.gz"
        body = gzip.compress(("\n".join(lines) + "\n").encode(), compresslevel=6)
        self.store().put(uri, body, "application/gzip")
        log.debug("archived %d runs to %s", len(lines), uri)

    def _record(self, pruned: int, seconds: float, error: str | None) -> None:
        try:
            with self._engine.connect() as conn, conn.begin():
                sql.record_pass(conn, pruned, seconds, error)
        except SQLAlchemyError as exc:  # the figures of a pass are not worth failing it for
            log.warning("could not record the retention pass: %s", exc)
