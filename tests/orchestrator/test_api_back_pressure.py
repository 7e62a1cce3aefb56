"""Back-pressure on the API's start path: once more starts wait for its database connections
than it lets queue, the next one is refused at once with 429 and ``Retry-After``, and the
waiting ones go through when Postgres moves again. (The burst of thousands of starts under
load is a chaos case: ``loadtest/chaos/burst.py``.)"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

import psycopg
import pytest
from sqlalchemy import make_url

from orchestrator.controller import create_app
from orchestrator.db import async_run_store
from orchestrator.settings import Settings
from tests.orchestrator.api_support import admin_key_of, keyed_client

# Tasks are registered only when a live worker loaded them.
pytestmark = pytest.mark.usefixtures("task_worker")

BODY = {"workflow": "noop_pipeline", "input": {"image": "s3://cdiflow/images/cat.png"}}


def _connect(database_url: str) -> psycopg.Connection[tuple[object, ...]]:
    url = make_url(database_url)
    return psycopg.connect(
        host=url.host, port=url.port, user=url.username, password=url.password,
        dbname=url.database,
    )  # fmt: skip


@contextlib.contextmanager
def _workflows_locked(database_url: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """The ``workflows`` table locked by another session: a start's insert waits, holding
    its connection, until the lock goes."""
    with _connect(database_url) as conn:
        conn.execute("LOCK TABLE workflows IN ACCESS EXCLUSIVE MODE")
        yield conn
        conn.rollback()


def _inserts_waiting_for_the_lock(database_url: str) -> int:
    with _connect(database_url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND query ILIKE '%INSERT%'"
        ).fetchone()
    assert row is not None
    return int(str(row[0]))


def test_a_start_beyond_the_queue_is_refused_with_retry_after(
    make_database: Callable[[str], str],
    api_settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # One connection and one place in the queue: the third start at once is one too many.
    monkeypatch.setattr(async_run_store, "POOL_MAX", 1)
    monkeypatch.setattr(async_run_store, "MAX_WAITING", 1)
    database_url = make_database("api_busy")
    settings = api_settings.model_copy(update={"database_url": database_url})
    with keyed_client(create_app(settings), admin_key_of(settings)) as client:
        # The key is looked up (and cached) and the pool's connection made before the lock.
        assert client.post("/api/workflows", json=BODY).status_code == 201
        with (
            ThreadPoolExecutor(3) as pool,
            _workflows_locked(database_url),
        ):
            holding = pool.submit(client.post, "/api/workflows", json=BODY)
            deadline = time.monotonic() + 30
            while not _inserts_waiting_for_the_lock(database_url):
                assert time.monotonic() < deadline, "the first start never reached Postgres"
                time.sleep(0.05)
            more = [pool.submit(client.post, "/api/workflows", json=BODY) for _ in range(2)]
            # One of the two waits for the connection; the other is refused without waiting.
            done, _ = wait(more, timeout=60, return_when=FIRST_COMPLETED)
            assert done, "neither start was answered while the first held the connection"
            refused = done.pop().result()
        answers = [holding.result(), *(f.result() for f in more)]
    assert refused.status_code == 429, refused.text
    assert refused.headers["Retry-After"] == "1"
    assert refused.json()["code"] == "overloaded"
    assert "send the request again" in refused.json()["detail"]
    assert sorted(a.status_code for a in answers) == [201, 201, 429]
