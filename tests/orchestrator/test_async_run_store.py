"""When the API's run store reads again, and when it does not (a small fake pool; the real
pool against a real Postgres is in ``test_api.py``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from psycopg_pool import PoolTimeout
from sqlalchemy import make_url

from orchestrator.db.async_run_store import AsyncRunStore
from orchestrator.errors import ServiceError


class _Connection:
    """Stands in for a connection: the store only notes when it was returned."""


class _FakePool:
    """Hands out connections, failing the first ``failures`` times with ``error``."""

    def __init__(self, error: Exception, failures: int) -> None:
        self.error, self.failures, self.handed, self.checks = error, failures, 0, 0

    async def check(self) -> None:
        self.checks += 1

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[Any]:
        self.handed += 1
        if self.handed <= self.failures:
            raise self.error
        yield _Connection()


def _store(pool: _FakePool) -> AsyncRunStore:
    # Nothing connects until ``open``: the real pool is built and then replaced.
    store = AsyncRunStore(make_url("postgresql+psycopg://u@127.0.0.1:1/db"))
    store._pool = pool  # type: ignore[assignment]
    return store


async def _answer(conn: Any) -> str:
    return "answer"


def test_a_read_on_a_dropped_connection_runs_again_once() -> None:
    pool = _FakePool(psycopg.OperationalError("server closed the connection"), failures=1)
    assert asyncio.run(_store(pool)._twice(_answer)) == "answer"
    assert pool.handed == 2 and pool.checks == 1


def test_a_read_that_fails_twice_is_a_service_error() -> None:
    pool = _FakePool(psycopg.OperationalError("server closed the connection"), failures=2)
    with pytest.raises(ServiceError, match="Postgres is unreachable"):
        asyncio.run(_store(pool)._twice(_answer))
    assert pool.handed == 2


def test_a_pool_timeout_is_not_waited_out_twice() -> None:
    pool = _FakePool(PoolTimeout("couldn't get a connection after 10.00 sec"), failures=1)
    with pytest.raises(ServiceError, match="PoolTimeout"):
        asyncio.run(_store(pool)._twice(_answer))
    assert pool.handed == 1 and pool.checks == 0


def test_a_full_disk_says_so_and_is_not_tried_twice() -> None:
    full = psycopg.errors.DiskFull('could not extend file "base/1/2": No space left on device')
    pool = _FakePool(full, failures=2)
    with pytest.raises(ServiceError, match="the disk of its data folder is full") as caught:
        asyncio.run(_store(pool)._twice(_answer))
    assert "unreachable" not in str(caught.value)
    assert pool.handed == 1  # another connection would meet the same full disk
