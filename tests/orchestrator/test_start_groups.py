"""Starts that arrive together are written together (``db.async_run_store``): one statement
and one commit for the group, one wake-up, and each start still answered on its own — a start
that makes no run, or that Postgres refuses, fails alone. (Many starts through the API of a
real stack, each recorded once and run: ``test_e2e.py``.)"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from typing import Any

import psycopg
import pytest
from sqlalchemy import make_url

from orchestrator.contract.vocabulary import DataPlane, Policy
from orchestrator.db.async_run_store import AsyncRunStore
from orchestrator.errors import IdempotencyKeyReused

# Tasks are registered only when a live worker loaded them.
pytestmark = pytest.mark.usefixtures("api_client", "task_worker")


def _created_in(database_url: str, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, int]:
    """The transaction that wrote each run's ``workflow.created`` event (never updated)."""
    url = make_url(database_url)
    with psycopg.connect(
        host=url.host, port=url.port, user=url.username, password=url.password,
        dbname=url.database,
    ) as conn:  # fmt: skip
        rows = conn.execute(
            "SELECT workflow_id, xmin::text::bigint FROM events "
            "WHERE kind = 'workflow.created' AND workflow_id = ANY(%s)",
            (list(ids),),
        ).fetchall()
    return {workflow_id: int(xid) for workflow_id, xid in rows}


async def _starts(
    database_url: str, starts: Sequence[dict[str, Any]]
) -> tuple[list[Any], list[list[uuid.UUID]]]:
    """``starts`` (keyword arguments of ``create``) sent at once on one store: each one's
    outcome (a row or the exception), and the ids each wake-up named."""
    woken: list[list[uuid.UUID]] = []

    async def started(ids: Sequence[uuid.UUID]) -> None:
        woken.append(list(ids))

    def start(given: dict[str, Any]) -> Any:
        given = dict(given)
        definition = given.pop("definition", "noop_pipeline")
        return store.create(
            definition, {}, policy=Policy.AFFINITY, data_plane=DataPlane.NONE,
            workflow_id=uuid.uuid4(), **given,
        )  # fmt: skip

    store = AsyncRunStore(make_url(database_url), started=started)
    await store.open()
    try:
        outcomes = await asyncio.gather(*map(start, starts), return_exceptions=True)
    finally:
        await store.close()
    return outcomes, woken


def test_starts_that_arrive_together_share_one_commit_and_one_wake_up(
    api_database_url: str,
) -> None:
    outcomes, woken = asyncio.run(_starts(api_database_url, [{} for _ in range(10)]))
    ids = [row.id for row in outcomes]
    assert len(set(ids)) == 10 and all(row.status == "PENDING" for row in outcomes)
    # The first finds no group being written and goes alone; the nine behind it go together.
    xids = _created_in(api_database_url, ids)
    assert sorted(xids) == sorted(ids)
    assert len(set(xids.values())) <= 2, xids
    assert sorted(i for group in woken for i in group) == sorted(ids)
    assert len(woken) == len(set(xids.values()))


def test_a_start_that_makes_no_run_fails_alone(api_database_url: str) -> None:
    key = f"key-{uuid.uuid4()}"
    starts: list[dict[str, Any]] = [{} for _ in range(6)]
    starts += [
        {"definition": "no_such_workflow"},
        # One key twice in the group with one body: one run, answered to both.
        {"idempotency_key": key, "request_digest": "a", "started_by": "admin"},
        {"idempotency_key": key, "request_digest": "a", "started_by": "admin"},
        # The same key with another body: refused, alone.
        {"idempotency_key": key, "request_digest": "b", "started_by": "admin"},
    ]
    outcomes, woken = asyncio.run(_starts(api_database_url, starts))
    good, missing, keyed, again, other = outcomes[:6], outcomes[6], *outcomes[7:]
    assert all(row.status == "PENDING" for row in good)
    assert missing is None  # the route answers 404, naming the workflows there are
    assert keyed.id == again.id
    assert isinstance(other, IdempotencyKeyReused)
    made = {i for group in woken for i in group}
    assert made == {row.id for row in good} | {keyed.id}


def test_a_start_postgres_refuses_fails_alone_and_the_others_commit(
    api_database_url: str,
) -> None:
    # A caller's name longer than its column: Postgres refuses the statement holding it.
    starts: list[dict[str, Any]] = [{} for _ in range(5)]
    starts += [{"started_by": "x" * 100}, *({} for _ in range(4))]
    outcomes, woken = asyncio.run(_starts(api_database_url, starts))
    refused = outcomes.pop(5)
    assert isinstance(refused, psycopg.errors.StringDataRightTruncation), refused
    assert all(row.status == "PENDING" for row in outcomes)
    ids = [row.id for row in outcomes]
    assert sorted(_created_in(api_database_url, ids)) == sorted(ids)
    assert sorted(i for group in woken for i in group) == sorted(ids)
