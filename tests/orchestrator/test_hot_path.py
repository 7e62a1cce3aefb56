"""When the API's hot path reads again, and when it does not (a small fake pool; the real
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

from orchestrator.controller.hot_path import HotPath
from orchestrator.errors import ServiceError


class _Connection:
    """Stands in for a connection: the hot path only notes when it was returned."""


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


def _hot_path(pool: _FakePool) -> HotPath:
    # Nothing connects until ``open``: the real pool is built and then replaced.
    hot = HotPath(make_url("postgresql+psycopg://u@127.0.0.1:1/db"), "redis://127.0.0.1:1/0")
    hot._pool = pool  # type: ignore[assignment]
    return hot


async def _answer(conn: Any) -> str:
    return "answer"


def test_a_read_on_a_dropped_connection_runs_again_once() -> None:
    pool = _FakePool(psycopg.OperationalError("server closed the connection"), failures=1)
    assert asyncio.run(_hot_path(pool)._twice(_answer)) == "answer"
    assert pool.handed == 2 and pool.checks == 1


def test_a_read_that_fails_twice_is_a_service_error() -> None:
    pool = _FakePool(psycopg.OperationalError("server closed the connection"), failures=2)
    with pytest.raises(ServiceError, match="Postgres is unreachable"):
        asyncio.run(_hot_path(pool)._twice(_answer))
    assert pool.handed == 2


def test_a_pool_timeout_is_not_waited_out_twice() -> None:
    pool = _FakePool(PoolTimeout("couldn't get a connection after 10.00 sec"), failures=1)
    with pytest.raises(ServiceError, match="PoolTimeout"):
        asyncio.run(_hot_path(pool)._twice(_answer))
    assert pool.handed == 1 and pool.checks == 0
