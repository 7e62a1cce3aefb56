"""The scheduler's reads and writes of Postgres: one statement, one round trip, per event (the
reports a loop turn reads: one for them all); one transaction, one durable commit, per turn.

The statements are ``run_statements``'; this sends them on one psycopg connection, which
prepares a statement on the server at its second use, so its text is parsed once. Inside a
loop turn (``begin_turn`` … ``end_turn``) the turn's first statement opens a transaction and
``end_turn`` commits it, with ``synchronous_commit`` as the server has it (on in a durable
stack, ``services.postgres``): every report, claim, placement and ending of the turn is on disk
in one WAL flush before anything the turn decided is seen outside the scheduler (the loop runs
that after ``end_turn``). Outside a turn a statement is its own transaction (autocommit).

A turn's reports are held (``report_later``) and recorded together in one set-based statement
(``run_statements.REPORTS``, one array element a report) by ``flush``: the loop calls it once
the turn has read them, and every other statement of the turn, and its commit, call it first,
so the turn's writes reach Postgres in the order they were made. *Why:* psycopg's Python for
one execute (the query's conversion, its parameters' dumping, the round trip) cost more than
the statement's own work, once per report.

Task run ids are reserved ahead (a block of the table's sequence per round trip) so that the
scheduler can push an instruction *before* it records the task run: the record then overlaps
the worker's run instead of delaying it. Only the scheduler's loop thread reads its reports,
after the record's statement has returned, so a report never finds its row missing.

Only the scheduler's loop thread uses a ``SchedulerStore``.
"""

from __future__ import annotations

import functools
import logging
import re
import uuid
from collections import deque
from collections.abc import Callable, Collection, Sequence
from dataclasses import replace
from typing import Any, Final, LiteralString

import psycopg
from psycopg.pq import ExecStatus, TransactionStatus
from psycopg.types.json import Jsonb
from sqlalchemy import Engine
from sqlalchemy.pool import PoolProxiedConnection

from orchestrator.contract.messages import Report
from orchestrator.contract.vocabulary import WorkflowStatus
from orchestrator.db import run_statements as sql
from orchestrator.db.engine import postgres_failed
from orchestrator.db.repository.workflows import STATUS_SQL
from orchestrator.db.run_statements import Claimed, Finish, Handoff, Placement, Reported
from orchestrator.errors import ServiceError

__all__ = ["CLAIM_LOCK_CLASS", "CLAIM_LOCK_KEY", "ID_BLOCK", "Recorded", "SchedulerStore"]

log = logging.getLogger(__name__)

ID_BLOCK: Final = 64  # task run ids reserved per round trip
# The advisory lock (class, key) claims with concurrency limits are taken under.
CLAIM_LOCK_CLASS: Final = 0x0CD21
CLAIM_LOCK_KEY: Final = 1


_PLACEHOLDER: Final = re.compile(r"%\((\w+)\)s")


@functools.cache
def _native(statement: LiteralString) -> tuple[LiteralString, tuple[str, ...]]:
    """``statement`` with Postgres's own placeholders (``$1``, ``$2`` …, one a name) and the
    names in their order. *Why:* psycopg converts a ``%(name)s`` statement on every execute,
    and keeps the conversion only for statements up to 4 KiB; ``REPORTS`` is longer, and
    converting it was a fifth of the cost of recording a turn's reports (py-spy)."""
    names: dict[str, int] = {}

    def number(match: re.Match[str]) -> str:
        return f"${names.setdefault(match.group(1), len(names) + 1)}"

    # ``%%`` is psycopg's escape for ``%``, which a raw cursor would send as it is.
    return _PLACEHOLDER.sub(number, statement).replace("%%", "%"), tuple(names)


class Recorded:
    """A report ``SchedulerStore.report_later`` holds: once recorded, whether it ended its
    workflow (``ended``), and what waited for that (``then``) is run."""

    def __init__(self) -> None:
        self.ended: bool | None = None  # None: not recorded yet
        self._then: list[Callable[[bool], None]] = []

    def then(self, action: Callable[[bool], None]) -> None:
        """Run ``action(ended)`` once the report is recorded (at once if it is)."""
        if self.ended is None:
            self._then.append(action)
        else:
            action(self.ended)

    def done(self, ended: bool) -> None:
        self.ended = ended
        then, self._then = self._then, []
        for action in then:
            action(ended)


class SchedulerStore:
    """Claims, placements, reports, endings and recoveries, one round trip each."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._pooled: PoolProxiedConnection | None = None
        self._ids: deque[int] = deque()
        self._turn = False  # inside a loop turn: statements join its transaction
        self._turn_broken = False  # the turn's connection was lost: its writes with it
        self._pending: list[tuple[Reported, Recorded]] = []  # reports held for ``flush``
        # Called as ``flush`` begins: it sends the instructions of the steps the held reports
        # place (*send, then record*), and names the task runs of those Redis did not take,
        # which are not recorded (``Dispatcher.unrecorded``).
        self.before_flush: Callable[[], Collection[int]] | None = None

    def close(self) -> None:
        if self._pooled is not None:
            pooled, self._pooled = self._pooled, None
            pooled.invalidate()  # autocommit was changed: never hand it back to the pool
            self._turn_broken = self._turn
        self._pending = []  # they belonged to the turn's transaction, lost with it

    # ------------------------------------------------------------------ a loop turn
    def begin_turn(self) -> None:
        """Statements from now to ``end_turn`` go in one transaction (opened by the first)."""
        self._turn, self._turn_broken = True, False

    def end_turn(self, *, commit: bool = True) -> bool:
        """Commit the turn's transaction (durably: one WAL flush); whether its writes are in
        Postgres. False when a statement of the turn failed (the transaction is rolled back, or
        was lost with its connection) or ``commit`` is False: memory may then differ from
        Postgres. Raises ``ServiceError`` if Postgres failed the commit. The reports held
        (``report_later``) are recorded first."""
        if commit and not self._turn_broken:
            try:
                self.flush()
            except (psycopg.Error, ServiceError) as exc:
                log.warning("Postgres failed the turn's reports (%s); rolling the turn back", exc)
                self._turn_broken = True
        self._pending = []
        self._turn = False
        broken, self._turn_broken = self._turn_broken, False
        if self._pooled is None:
            return not broken
        conn = self._connection()
        state = conn.info.transaction_status
        if state is TransactionStatus.IDLE:
            return not broken
        try:
            if state is TransactionStatus.INTRANS and commit and not broken:
                conn.execute("COMMIT", prepare=False)
                return True
            conn.execute("ROLLBACK", prepare=False)
            return False
        except psycopg.Error as exc:  # the connection lost, or the commit refused: rolled back
            self.close()
            raise postgres_failed(exc, "Postgres failed the scheduler's commit") from exc

    # ------------------------------------------------------------------ a run's life
    def claim(
        self, scheduler_id: str, limit: int, reclaim_after_s: float, *, limits: bool = False
    ) -> list[Claimed]:
        """Take up to ``limit`` PENDING workflows, highest priority and oldest first, and mark
        them RUNNING; a claim older than ``reclaim_after_s`` is taken over
        (``run_statements.CLAIM``). With ``limits`` (some definition has a concurrency limit)
        the claim counts each limited definition's RUNNING runs under the claims' lock, in a
        transaction of its own (``CLAIM_LIMITED``)."""
        params = {"me": scheduler_id, "limit": limit, "reclaim_s": reclaim_after_s}
        if not limits:
            return [sql.claimed_from_row(row) for row in self._run(sql.CLAIM, params)]
        lock = {"cls": CLAIM_LOCK_CLASS, "key": CLAIM_LOCK_KEY}
        rows = self._transaction([(sql.CLAIM_LOCK, lock), (sql.CLAIM_LIMITED, params)])
        return [sql.claimed_from_row(row) for row in rows]

    def limits_exist(self) -> bool:
        """Whether any workflow definition has a concurrency limit."""
        return bool(self._run(sql.LIMITS_EXIST, {})[0][0])

    def paused_among(self, ids: Collection[uuid.UUID]) -> set[uuid.UUID]:
        """Which of ``ids`` are paused now."""
        return {row[0] for row in self._run(sql.PAUSED, {"ids": list(ids)})} if ids else set()

    def resume(
        self, scheduler_id: str, reason: str, running: Collection[uuid.UUID] = ()
    ) -> list[Claimed]:
        """This scheduler's RUNNING workflows but those it runs (``running``), their open task
        runs failed with ``reason``."""
        params = {"me": scheduler_id, "reason": reason, "running": list(running)}
        return [sql.claimed_from_row(row) for row in self._run(sql.RESUME, params)]

    def definitions(
        self, names: Collection[str]
    ) -> tuple[dict[str, list[dict[str, Any]]], dict[str, dict[str, Any]]]:
        """The current steps of the (not deleted) workflow definitions ``names``, and the
        definitions of the tasks those steps name (a sub-workflow step's; a rare path, so two
        plain queries)."""
        found = {
            str(row[0]): list(row[1])
            for row in self._run(sql.SUB_DEFINITIONS, {"names": list(names)})
        }
        wanted = {str(s["task"]) for steps in found.values() for s in steps if s.get("task")}
        rows = self._run(sql.TASK_DEFINITIONS, {"names": sorted(wanted)})
        tasks: dict[str, dict[str, Any]] = {
            str(r[0]): {"module": r[1], "timeout_s": r[2], "retries": r[3],
                        "retry_backoff_s": r[4], "max_concurrency": r[5]}
            for r in rows
        }  # fmt: skip
        return found, tasks

    def next_task_run_id(self) -> int:
        """A task run id nobody else gets (reserved from the table's sequence in blocks)."""
        if not self._ids:
            # No write waits for this read of the sequence: the reports held stay held.
            rows = self._run(sql.RESERVE_IDS, {"n": ID_BLOCK}, flush=False)
            self._ids.extend(int(row[0]) for row in rows)
        return self._ids.popleft()

    def place(self, placements: Sequence[Placement]) -> None:
        """Record task runs: QUEUED ones (with the hand-offs that moved their objects), or
        ones that ended without a worker (skipped, a switch)."""
        if placements:
            self._run(sql.PLACE, sql.placement_params(placements))

    def report(
        self,
        report: Report,
        back: Sequence[Handoff] = (),
        placements: Sequence[Placement] = (),
        finish: Finish | None = None,
        data: dict[str, Any] | None = None,
    ) -> bool:
        """Record ``report`` (its hand-backs, and ``data``: the named data it made), place the
        next steps or end the workflow, now, in one statement; whether ``finish`` ended the
        workflow (False: it had ended already)."""
        ended = self._record([Reported(report, back, placements, finish, data)])
        return finish is not None and finish.workflow_id in ended

    def report_later(self, entry: Reported) -> Recorded:
        """``report``, with the other reports of the loop turn: they are recorded together,
        in one statement, by ``flush``, which every other statement of the turn and its
        commit call first, so the turn's writes keep their order. Outside a turn, at once
        (through ``report``)."""
        recorded = Recorded()
        if not self._turn:
            recorded.done(self.report(entry.report, entry.back, entry.placements,
                                      entry.finish, entry.data))  # fmt: skip
            return recorded
        self._pending.append((entry, recorded))
        return recorded

    def flush(self) -> None:
        """Record the reports ``report_later`` holds, in one statement; then tell each one's
        ``Recorded`` whether it ended its workflow."""
        if not self._pending:
            return
        unsent = self.before_flush() if self.before_flush is not None else ()
        pending, self._pending = self._pending, []
        batch = [entry for entry, _ in pending]
        if unsent:
            batch = [
                replace(e, placements=[p for p in e.placements if p.task_run_id not in unsent])
                for e in batch
            ]
        ended = self._record(batch)
        for entry, recorded in pending:
            finish = entry.finish
            recorded.done(finish is not None and finish.workflow_id in ended)

    def _record(self, batch: Sequence[Reported]) -> set[uuid.UUID]:
        """Run ``REPORTS`` for ``batch``: the workflows it ended."""
        rows = self._run(sql.REPORTS, sql.reports_params(batch), flush=False)
        return {row[0] for row in rows}

    def late_report(self, report: Report) -> bool:
        """Record a report read again as the scheduler starts (``run_statements.LATE_REPORT``):
        whether its task run was still open."""
        params = sql.reports_params([Reported(report)])
        return bool(self._run(sql.LATE_REPORT, params))

    def finish(self, finish: Finish) -> bool:
        """End a workflow; False if it had already ended (a user cancelled it meanwhile)."""
        rows = self._run(sql.FINISH, sql.finish_params(finish))
        return bool(rows and rows[0][0])

    # ------------------------------------------------------------------ what goes wrong
    def task_run_lost(self, task_run_id: int, reason: str) -> None:
        """Fail a task run whose worker died or went silent, unless its report came first."""
        self._run(sql.LOST, {"id": task_run_id, "reason": reason})

    def redriven(self, workflow_id: uuid.UUID, reason: str) -> None:
        """A run driven again from its input: its open task runs fail with ``reason``."""
        self._run(sql.REDRIVEN, {"id": workflow_id, "reason": reason})

    def statuses(self, ids: Collection[uuid.UUID]) -> dict[uuid.UUID, WorkflowStatus]:
        """The status of each of ``ids`` that exists."""
        rows = self._run(sql.STATUSES, {"ids": list(ids)})
        return {row[0]: WorkflowStatus(row[1]) for row in rows}

    def status(self, workflow_id: uuid.UUID) -> WorkflowStatus | None:
        """A run's status (None if there is no such run)."""
        rows = self._run(STATUS_SQL, {"id": workflow_id})
        return WorkflowStatus(rows[0][0]) if rows else None

    def waiting(
        self, workflow_id: uuid.UUID, detail: str | None, kind: str, data: dict[str, Any]
    ) -> None:
        """Say what a RUNNING run waits for (``detail``; None: it waits no more), with an
        event of ``kind``."""
        params = {"id": workflow_id, "detail": detail, "kind": kind, "data": Jsonb(data)}
        self._run(sql.WAITING, params)

    def unqueue(self, workflow_id: uuid.UUID) -> None:
        """Mark a cancelled run's task runs that no worker took CANCELLED."""
        self._run(sql.UNQUEUE, {"id": workflow_id})

    # ------------------------------------------------------------------ connection
    def _transaction(
        self, statements: Sequence[tuple[LiteralString, dict[str, Any]]]
    ) -> list[tuple[Any, ...]]:
        """Run ``statements`` in one transaction; the rows of the last."""
        self.flush()
        conn = self._connection()
        try:
            rows: list[tuple[Any, ...]] = []
            # In a turn, a savepoint inside the turn's transaction.
            with conn.transaction(), conn.cursor() as cur:
                for statement, params in statements:
                    cur.execute(statement, params)
                    result = cur.pgresult
                    ok = result and result.status == ExecStatus.TUPLES_OK
                    rows = cur.fetchall() if ok else []
            return rows
        except psycopg.OperationalError as exc:
            self.close()
            raise postgres_failed(exc, "Postgres failed the scheduler's statement") from exc

    def _run(
        self, statement: LiteralString, params: dict[str, Any], *, flush: bool = True
    ) -> list[tuple[Any, ...]]:
        """Run ``statement``, after the reports held (``flush``: the turn's writes keep their
        order); its rows."""
        if flush and self._pending:
            self.flush()
        conn = self._connection()
        text, names = _native(statement)
        try:
            with psycopg.RawCursor(conn) as cur:
                cur.execute(text, [params[name] for name in names])
                # The result's status, not ``cur.description``: that builds a Column per field
                # on every call (3 % of the scheduler's GIL samples at 10 KB, py-spy).
                result = cur.pgresult
                return cur.fetchall() if result and result.status == ExecStatus.TUPLES_OK else []
        except psycopg.OperationalError as exc:
            self.close()  # the next call reconnects
            raise postgres_failed(exc, "Postgres failed the scheduler's statement") from exc

    def connection(self) -> psycopg.Connection[tuple[Any, ...]]:
        """The loop's connection (made again after ``close``), for statements of other stores
        that run on the loop thread (``schedule_store``): autocommit, or in a turn inside the
        turn's transaction (so ``conn.transaction()`` there is a savepoint), after the
        reports held."""
        self.flush()
        return self._connection()

    def _connection(self) -> psycopg.Connection[tuple[Any, ...]]:
        if self._pooled is None:
            self._pooled = self._engine.raw_connection()
            driver = self._pooled.driver_connection
            assert isinstance(driver, psycopg.Connection)
            driver.rollback()  # autocommit can change only outside a transaction
            driver.autocommit = True
        driver = self._pooled.driver_connection
        assert isinstance(driver, psycopg.Connection)
        if self._turn and driver.info.transaction_status is TransactionStatus.IDLE:
            try:
                driver.execute("BEGIN", prepare=False)
            except psycopg.OperationalError as exc:
                self.close()
                raise postgres_failed(exc, "Postgres failed the scheduler's statement") from exc
        return driver
