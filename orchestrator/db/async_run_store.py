"""A workflow's start and its reads on the API's event loop, on an asyncio psycopg pool.

Every start-and-wait request inserts a run and, once the run has ended, reads its detail.
Through SQLAlchemy in a worker thread each statement paid for a thread hop, the pool's
pre-ping and SQLAlchemy's execution around psycopg; on an asyncio psycopg pool it pays for none
of them (measured as the API's CPU per 10 KB workflow in the load tests). The SQL is
the repository's own statements compiled once for psycopg (``repository.workflows``), so each
still has one definition. Everything else the API does stays on the synchronous engine in
worker threads: it is not on a workflow's path.

A connection idle for more than ``CHECK_IDLE_S`` is pinged before use (what ``pool_pre_ping``
does for every use), so a Postgres restarted while the API waited costs no request; one in
steady use is not, which saves a round trip a statement. If Postgres drops a connection in
steady use, the pool's idle connections are checked and the statement runs once more on
another connection: a read changes nothing, and a start that committed before its connection
dropped finds its run the second time instead of inserting it again (the API chose its id).

*Starts go in groups* (group commit). A start that finds no group being written is written at
once, alone; those that arrive while a group's statement and commit are in flight wait for it
and then go together, up to ``MAX_GROUP``, in one statement (``CREATE_STATEMENT`` takes arrays)
and one commit: one WAL flush and one wake-up of the scheduler for the group instead of one
each. Each request is answered once its run is committed. Under load a group takes what
arrived during the last commit; idle, a start waits for nothing. A start that makes no run
(its definition gone, its ``Idempotency-Key`` taken) is told so alone, as before; a statement
that fails for a reason other than the connection is tried again one start at a time, so a
start Postgres refuses fails alone.

*Back-pressure.* At most ``MAX_WAITING`` statements wait for a connection, and at most
``MAX_WAITING`` starts for their group; one more is refused at once with ``Overloaded`` (HTTP
429, ``Retry-After``) instead of joining a queue it would leave only by the pool's timeout, as a
503 naming a Postgres that is in fact answering. *Why here:* the connections are what a burst
of starts runs out of; the event loop takes thousands of requests, each a few bytes, and
refuses the excess cheaply.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

import psycopg
from psycopg.rows import namedtuple_row
from psycopg_pool import AsyncConnectionPool, PoolTimeout, TooManyRequests
from sqlalchemy import URL

from orchestrator.contract.vocabulary import DataPlane, Policy, WorkflowStatus
from orchestrator.db.engine import disk_full, postgres_failed
from orchestrator.db.repository.api_keys import KEY_BY_HASH_SQL
from orchestrator.db.repository.workflows import (
    CREATE_SQL,
    DETAIL_SQL,
    IDEMPOTENT_SQL,
    RECENT_EVENTS_SQL,
    STATUS_SQL,
    create_many_params,
    create_params,
)
from orchestrator.errors import IdempotencyKeyReused, NotFound, Overloaded, ServiceError

__all__ = ["CHECK_IDLE_S", "MAX_WAITING", "AsyncRunStore"]

log = logging.getLogger(__name__)

CHECK_IDLE_S: Final = 2.0
POOL_MAX: Final = 8  # statements in flight at once; the loop thread runs one at a time anyway
# Statements waiting for a connection: a fraction of a second's work for the pool on a busy
# machine, far below its timeout.
MAX_WAITING: Final = 16 * POOL_MAX
RETRY_AFTER_S: Final = 1
MAX_GROUP: Final = 64  # starts in one statement and commit

Started = Callable[[Sequence[uuid.UUID]], Awaitable[None]]

T = TypeVar("T")
_Row = Any  # a named tuple: attributes by column name, as the API's schemas read rows


@dataclass
class _Start:
    """A start waiting for its group: its parameters, and the answer it waits for."""

    params: dict[str, Any]
    answer: asyncio.Future[_Row | None] = field(repr=False)

    @property
    def id(self) -> uuid.UUID:
        workflow_id: uuid.UUID = self.params["id"]
        return workflow_id

    def tell(self, outcome: _Row | BaseException | None) -> None:
        if self.answer.done():  # its request went away: the run stands, nobody asks
            return
        if isinstance(outcome, BaseException):
            self.answer.set_exception(outcome)
        else:
            self.answer.set_result(outcome)


class AsyncRunStore:
    """An asyncio psycopg pool for the API's per-request statements: a run's start, status
    and detail, and the API key a request came with. ``started`` is told the ids of the runs
    each commit made (to wake the scheduler once for them)."""

    def __init__(
        self,
        database_url: URL,
        *,
        max_size: int | None = None,
        max_waiting: int | None = None,
        started: Started | None = None,
    ) -> None:
        conninfo = database_url.set(drivername="postgresql").render_as_string(hide_password=False)
        self._returned: weakref.WeakKeyDictionary[psycopg.AsyncConnection[Any], float]
        self._returned = weakref.WeakKeyDictionary()
        self._pool: AsyncConnectionPool[psycopg.AsyncConnection[_Row]] = AsyncConnectionPool(
            conninfo,
            min_size=1,
            max_size=POOL_MAX if max_size is None else max_size,
            max_waiting=MAX_WAITING if max_waiting is None else max_waiting,
            open=False,
            timeout=10.0,
            name="api-runs",
            check=self._check_if_idle,
            # Autocommit: each statement is its own (durable) transaction, no BEGIN/COMMIT
            # round trips; prepared on the server at its second use, like the engine's.
            kwargs={"autocommit": True, "prepare_threshold": 1, "row_factory": namedtuple_row},
        )
        self._started = started
        self._max_waiting = MAX_WAITING if max_waiting is None else max_waiting
        self._waiting: list[_Start] = []  # for the next group
        self._writer: asyncio.Task[None] | None = None  # writes groups while starts wait

    async def open(self) -> None:
        await self._pool.open()

    async def close(self) -> None:
        if self._writer is not None:
            await asyncio.wait([self._writer])
        await self._pool.close()

    # ------------------------------------------------------------------ statements
    async def create(
        self,
        definition: str,
        input: dict[str, Any],
        *,
        policy: Policy,
        data_plane: DataPlane,
        workflow_id: uuid.UUID,
        version: int | None = None,
        started_by: str | None = None,
        priority: int | None = None,
        tags: Sequence[str] = (),
        idempotency_key: str | None = None,
        request_digest: str | None = None,
        timeout_s: float | None = None,
    ) -> _Row | None:
        """Insert a PENDING run (and its event) in its group's statement (*Starts go in
        groups*, above) and return it once committed; a run with this id that exists already
        is returned as it is; ``None`` if ``definition`` (or that ``version`` of it) does not
        exist. ``started_by``: the name of the API key that asked. With ``idempotency_key``,
        the run that key of that caller made already is returned (its id is not
        ``workflow_id``), or ``IdempotencyKeyReused`` when that run was started with another
        body (``request_digest``). ``timeout_s``: the run's time limit (default: the
        version's)."""
        params = create_params(
            definition,
            input,
            policy,
            data_plane,
            None,
            workflow_id,
            version=version,
            started_by=started_by,
            priority=priority,
            tags=tags,
            idempotency_key=idempotency_key,
            request_digest=request_digest,
            timeout_s=timeout_s,
        )
        if len(self._waiting) >= self._max_waiting:
            raise Overloaded(
                f"the API is at capacity ({len(self._waiting)} starts already wait for the one "
                f"being written); send the request again in {RETRY_AFTER_S} s",
                retry_after_s=RETRY_AFTER_S,
            )
        start = _Start(params, asyncio.get_running_loop().create_future())
        self._waiting.append(start)
        if self._writer is None:
            self._writer = asyncio.create_task(self._write_groups())
        return await start.answer

    async def _write_groups(self) -> None:
        """Write the starts waiting, a group at a time, until none waits."""
        group: list[_Start] = []
        try:
            while self._waiting:
                group, self._waiting = self._waiting[:MAX_GROUP], self._waiting[MAX_GROUP:]
                outcomes: list[_Row | Exception | None]
                try:
                    outcomes = await self._twice(functools.partial(self._insert, group))
                except Exception as exc:  # the connection, the pool, the disk: the group's
                    outcomes = [exc] * len(group)
                made = [
                    s.id
                    for s, row in zip(group, outcomes, strict=True)
                    if row is not None and not isinstance(row, Exception) and row.id == s.id
                ]
                if made and self._started is not None:
                    try:
                        await self._started(made)
                    except Exception:  # a hint: the scheduler also looks at Postgres
                        log.exception("could not tell that %d runs were started", len(made))
                for start, outcome in zip(group, outcomes, strict=True):
                    start.tell(outcome)
        finally:
            for start in [*group, *self._waiting]:
                start.answer.cancel()  # only those not told: the store is closing
            self._waiting, self._writer = [], None

    async def _insert(
        self, group: list[_Start], conn: psycopg.AsyncConnection[_Row]
    ) -> list[_Row | Exception | None]:
        """The group's runs in one statement (one transaction), then what each start made;
        one start at a time if Postgres refused the statement (connection failures go up)."""
        try:
            cursor = await conn.execute(CREATE_SQL, create_many_params([s.params for s in group]))
            rows = {row.id: row for row in await cursor.fetchall()}
        except psycopg.OperationalError:
            raise
        except psycopg.Error as exc:
            if len(group) == 1:
                return [exc]
            log.warning("Postgres refused %d starts together (%s): one at a time", len(group), exc)
            return [outcome for s in group for outcome in await self._insert([s], conn)]
        outcomes: list[_Row | Exception | None] = []
        for start in group:
            try:
                outcomes.append(rows.get(start.id) or await self._not_inserted(conn, start))
            except IdempotencyKeyReused as exc:
                outcomes.append(exc)
        return outcomes

    @staticmethod
    async def _not_inserted(conn: psycopg.AsyncConnection[_Row], start: _Start) -> _Row | None:
        """Why the statement made no run for ``start``: its key's run, an earlier try's run, or
        ``None`` (no such definition)."""
        params = start.params
        key, digest = params["idempotency_key"], params["request_digest"]
        if key is not None:
            # The key is taken (by a start committed before, or one before it in the group):
            # the run it made, if the body is the same.
            found = {"started_by": params["started_by"], "idempotency_key": key}
            cursor = await conn.execute(IDEMPOTENT_SQL, found)
            row = await cursor.fetchone()
            if row is not None:
                if row.request_digest != digest:
                    raise IdempotencyKeyReused(key, row.id)
                return row
        # No such definition, or an earlier try committed this very run.
        cursor = await conn.execute(DETAIL_SQL, {"id": start.id})
        return await cursor.fetchone()

    async def status(self, workflow_id: uuid.UUID) -> WorkflowStatus:
        """The run's status alone (what a long poll looks at before an announcement);
        ``NotFound`` if there is no such run."""

        async def read(conn: psycopg.AsyncConnection[_Row]) -> _Row | None:
            cursor = await conn.execute(STATUS_SQL, {"id": workflow_id})
            return await cursor.fetchone()

        row = await self._twice(read)
        if row is None:
            raise NotFound("workflow run", workflow_id)
        return WorkflowStatus(row.status)

    async def detail(self, workflow_id: uuid.UUID, events: int) -> tuple[_Row, list[_Row]]:
        """The run's columns with ``task_runs_json`` and ``handoffs_json``, and its latest
        ``events`` events, oldest first; ``NotFound`` if there is no such run."""

        async def read(conn: psycopg.AsyncConnection[_Row]) -> tuple[_Row, list[_Row]]:
            cursor = await conn.execute(DETAIL_SQL, {"id": workflow_id})
            row = await cursor.fetchone()
            if row is None:
                raise NotFound("workflow run", workflow_id)
            recent: list[_Row] = []
            if events:
                cursor = await conn.execute(RECENT_EVENTS_SQL, {"id": workflow_id, "limit": events})
                recent = list(reversed(await cursor.fetchall()))
            return row, recent

        return await self._twice(read)

    async def api_key(self, key_hash: str) -> _Row | None:
        """The key (``id``, ``name``, ``role``) whose digest is ``key_hash``, or ``None``."""

        async def read(conn: psycopg.AsyncConnection[_Row]) -> _Row | None:
            cursor = await conn.execute(KEY_BY_HASH_SQL, {"key_hash": key_hash})
            return await cursor.fetchone()

        return await self._twice(read)

    # ------------------------------------------------------------------ pool
    async def _twice(self, work: Callable[[psycopg.AsyncConnection[_Row]], Awaitable[T]]) -> T:
        """``work`` on a pooled connection; once more on another if Postgres dropped the first.
        Everything here may run twice: reads change nothing, and a start inserts a run whose id
        the API chose, which the second try finds instead of inserting again. A pool with no
        connection to give within its timeout is not asked twice, nor one with too many
        statements waiting (``Overloaded``)."""
        try:
            async with self._connection() as conn:
                return await work(conn)
        except ServiceError as exc:
            if isinstance(exc.__cause__, PoolTimeout) or disk_full(exc.__cause__ or exc):
                raise
            log.warning("Postgres dropped a connection (%s); trying again on another", exc)
            # A restarted Postgres dropped them all: check the idle ones before the next try.
            await self._pool.check()
        async with self._connection() as conn:
            return await work(conn)

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[psycopg.AsyncConnection[_Row]]:
        try:
            async with self._pool.connection() as conn:
                try:
                    yield conn
                finally:
                    self._returned[conn] = time.monotonic()
        except TooManyRequests as exc:
            raise Overloaded(
                f"the API is at capacity ({self._pool.max_waiting} requests already wait for "
                f"its {self._pool.max_size} database connections); send the request again in "
                f"{RETRY_AFTER_S} s",
                retry_after_s=RETRY_AFTER_S,
            ) from exc
        except (psycopg.OperationalError, PoolTimeout) as exc:
            raise postgres_failed(exc, "Postgres is unreachable") from exc

    async def _check_if_idle(self, conn: psycopg.AsyncConnection[Any]) -> None:
        returned = self._returned.get(conn)
        if returned is None or time.monotonic() - returned > CHECK_IDLE_S:
            await AsyncConnectionPool.check_connection(conn)
