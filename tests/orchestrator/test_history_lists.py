"""Lists whose cost follows the page: cursors that never skip or repeat a run, even while runs
are started; totals exact where they are kept and capped elsewhere; an index behind every
filter and window (read from Postgres's own plans, on a table of 60,000 runs)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from psycopg.types.json import Jsonb
from sqlalchemy import Engine, text
from sqlalchemy.dialects.postgresql import psycopg as psycopg_dialect
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.sql import ClauseElement

from orchestrator.contract.vocabulary import Policy, WorkflowStatus
from orchestrator.db import repository as repo
from orchestrator.db.repository import task_runs as task_repo
from orchestrator.db.repository.workflows import beyond_statement, page_statement

BIG = 60_000  # runs of the module's own definition, for the plans


def _definition(api_client: TestClient, name: str) -> str:
    body = {"name": name, "tasks": [{"ref": "a", "task": "noop"}]}
    assert api_client.post("/api/workflow-definitions", json=body).status_code == 201
    return name


# A history's mix: 86 % completed, 10 % failed, 4 % cancelled; 93 % affinity, 5 % transfer,
# 2 % auto (rare values are where a filter's own index matters).
_REAL_STATUS = ("CASE WHEN i % 100 < 86 THEN 'COMPLETED' WHEN i % 100 < 96 THEN 'FAILED' "
                "ELSE 'CANCELLED' END::workflow_status")  # fmt: skip
_REAL_POLICY = ("CASE WHEN i % 100 < 93 THEN 'affinity' WHEN i % 100 < 98 THEN 'transfer' "
                "ELSE 'auto' END::workflow_policy")  # fmt: skip


def insert_runs(engine: Engine, definition: str, n: int, *, spread: timedelta,
                real: bool = False, **fixed: Any) -> None:  # fmt: skip
    """``n`` runs of ``definition`` written set-based, created over ``spread`` before now:
    statuses and policies in turn, or (``real``) in a history's mix; ``fixed``: a column's
    value for all of them."""
    columns = {
        "status": _REAL_STATUS if real else
                  "(ARRAY['PENDING','RUNNING','COMPLETED','FAILED','CANCELLED'])[1 + i % 5]"
                  "::workflow_status",
        "policy": _REAL_POLICY if real else
                  "(ARRAY['affinity','transfer','auto'])[1 + i % 3]::workflow_policy",
        "created_at": "now() - CAST(:spread AS interval) * (i::float8 / :n)",
    }  # fmt: skip
    params: dict[str, Any] = {"definition": definition, "n": n, "spread": spread, "real": real}
    for name in fixed:
        columns[name] = f":{name}"
        params[name] = fixed[name]
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO workflows (id, definition, definition_version, data_plane, input, "
                f"{', '.join(columns)}, finished_at) "
                f"SELECT gen_random_uuid(), :definition, 1, 'cdi', '{{}}', "
                f"{', '.join(columns.values())}, "
                "CASE WHEN :real OR i % 5 >= 2 "
                "THEN now() - CAST(:spread AS interval) * (i::float8 / :n) "
                "+ interval '3 seconds' END "
                "FROM generate_series(1, :n) i"
            ),
            params,
        )


@pytest.fixture(scope="module")
def big(api_client: TestClient, api_engine: Engine) -> str:
    """A definition with ``BIG`` runs over 30 days and a task run each, analysed; each run
    tagged ``everyday`` (so a rarer tag's entries are a small part of the tags' index)."""
    name = _definition(api_client, f"big_{uuid.uuid4().hex[:6]}")
    insert_runs(api_engine, name, BIG, spread=timedelta(days=30), real=True, tags=["everyday"])
    with api_engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO task_runs (workflow_id, ref, task, attempt, status, queued_at, "
                "started_at, finished_at, queue_wait_ms, run_ms) "
                "SELECT id, 'a', 'noop', 1, 'COMPLETED', created_at, created_at, "
                "created_at + interval '2 seconds', 1, 2000 FROM workflows "
                "WHERE definition = :d AND finished_at IS NOT NULL"
            ),
            {"d": name},
        )
    with api_engine.connect() as conn:
        auto = conn.execution_options(isolation_level="AUTOCOMMIT")
        for table in ("workflows", "task_runs", "workflow_tags"):
            auto.execute(text(f"ANALYZE {table}"))
    return name


@pytest.fixture(scope="module")
def rare(api_client: TestClient, api_engine: Engine, big: str) -> str:
    """A definition with 1 % as many runs as ``big``, over the same 30 days."""
    name = _definition(api_client, f"rare_{uuid.uuid4().hex[:6]}")
    insert_runs(api_engine, name, BIG // 100, spread=timedelta(days=30), real=True)
    with api_engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").execute(text("ANALYZE workflows"))
    return name


@pytest.fixture(scope="module")
def scheduled(api_engine: Engine, big: str) -> str:
    """A schedule of ``big`` that made 1 % as many runs as it has, over the same 30 days, each
    tagged ``rare-tag`` and with ``{"camera": 7}`` in its input."""
    name = f"sched_{uuid.uuid4().hex[:6]}"
    with api_engine.begin() as conn:
        schedule = conn.execute(
            text(
                "INSERT INTO schedules (id, name, definition, cron, catchup, grace_s, input, "
                "policy, data_plane, next_fire_at, paused_at) VALUES (gen_random_uuid(), :n, "
                ":d, '0 * * * *', 'skip', 60, '{}', 'affinity', 'cdi', now(), now()) RETURNING id"
            ),
            {"n": name, "d": big},
        ).scalar_one()
    insert_runs(api_engine, big, BIG // 100, spread=timedelta(days=30), real=True,
                schedule_id=schedule, tags=["rare-tag"])  # fmt: skip
    with api_engine.begin() as conn:
        conn.execute(
            text("UPDATE workflows SET input = '{\"camera\": 7}' WHERE schedule_id = :s"),
            {"s": schedule},
        )
    with api_engine.connect() as conn:
        auto = conn.execution_options(isolation_level="AUTOCOMMIT")
        for table in ("workflows", "workflow_tags"):
            auto.execute(text(f"ANALYZE {table}"))
    return name


def _ids(reply: dict[str, Any]) -> list[str]:
    return [w["id"] for w in reply["items"]]


def _page(api_client: TestClient, **params: Any) -> dict[str, Any]:
    response = api_client.get("/api/workflows", params=params)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


# --- cursors ---------------------------------------------------------------------------------


def test_cursors_never_skip_or_repeat_a_run_while_runs_are_started(
    api_client: TestClient, api_engine: Engine
) -> None:
    flow = _definition(api_client, f"paged_{uuid.uuid4().hex[:6]}")
    # Many runs share a moment: the id orders them, and a page may end inside such a tie.
    insert_runs(api_engine, flow, 90, spread=timedelta(minutes=5))
    insert_runs(api_engine, flow, 40, spread=timedelta(0), created_at=datetime.now(UTC) - timedelta(
        minutes=2))  # fmt: skip
    before = {w["id"] for w in _page(api_client, workflow=flow, limit=200)["items"]}
    assert len(before) == 130

    stop = threading.Event()
    started: list[str] = []

    def start_more() -> None:
        while not stop.is_set():
            reply = api_client.post("/api/workflows", json={"workflow": flow, "input": {}})
            started.append(reply.json()["id"])

    writer = threading.Thread(target=start_more)
    writer.start()
    try:
        seen: list[str] = []
        pages: list[dict[str, Any]] = []
        cursor = None
        while True:
            page = _page(api_client, workflow=flow, limit=7,
                         **({"cursor": cursor} if cursor else {}))  # fmt: skip
            pages.append(page)
            seen += _ids(page)
            assert page["has_more"] == (page["next_cursor"] is not None)
            cursor = page["next_cursor"]
            if cursor is None:
                break
    finally:
        stop.set()
        writer.join(timeout=30)
    assert started, "runs were started while the list was paged"
    assert len(seen) == len(set(seen)), "a run was shown twice"
    assert before <= set(seen), "a run that existed all along was skipped"
    assert set(seen) - before <= set(started)
    # Back again with prev_cursor: the same pages, newest first.
    back = pages[-1]
    for expected in reversed(pages[1:-1]):
        back = _page(api_client, workflow=flow, limit=7, cursor=back["prev_cursor"])
        assert _ids(back) == _ids(expected)
    back = _page(api_client, workflow=flow, limit=7, cursor=back["prev_cursor"])
    assert _ids(back) == _ids(pages[0])
    while back["prev_cursor"] is not None:  # the runs started meanwhile, above page one
        back = _page(api_client, workflow=flow, limit=7, cursor=back["prev_cursor"])
    top = _page(api_client, workflow=flow, limit=7)
    assert _ids(back) == _ids(top) and len(top["items"]) == 7  # the top is page one, full


def test_pages_by_tag_follow_the_runs_as_they_are_started_retagged_and_deleted(
    api_client: TestClient, api_engine: Engine
) -> None:
    flow = _definition(api_client, f"tagged_{uuid.uuid4().hex[:6]}")
    one, two = f"t1-{uuid.uuid4().hex[:6]}", f"t2-{uuid.uuid4().hex[:6]}"
    insert_runs(api_engine, flow, 30, spread=timedelta(minutes=5), tags=[one])
    insert_runs(api_engine, flow, 12, spread=timedelta(minutes=5), tags=[one, two])
    started = [
        api_client.post("/api/workflows", json={"workflow": flow, "input": {}, "tags": tags})
        for tags in ([one], [two, one], [two])
    ]
    assert all(r.status_code in (200, 201, 202) for r in started), [r.text for r in started]

    def naive(*tags: str, status: str | None = None) -> list[str]:
        """Newest first, straight from the runs' own tags."""
        with api_engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT id FROM workflows WHERE definition = :d AND tags @> :t "
                    "AND (CAST(:s AS text) IS NULL OR status::text = :s) "
                    "ORDER BY created_at DESC, id DESC"
                ),
                {"d": flow, "t": list(tags), "s": status},
            )
            return [str(r) for (r,) in rows]

    def paged(*tags: str, **more: str) -> list[str]:
        seen: list[str] = []
        cursor: str | None = None
        while True:
            page = _page(api_client, workflow=flow, tag=list(tags), limit=7,
                         **more, **({"cursor": cursor} if cursor else {}))  # fmt: skip
            seen += _ids(page)
            cursor = page["next_cursor"]
            if cursor is None:
                return seen

    assert len(naive(one)) == 44 and len(naive(one, two)) == 13
    for tags in ((one,), (two,), (one, two), (two, one)):
        assert paged(*tags) == naive(*tags), tags
    assert paged(one, status="PENDING") == naive(one, status="PENDING")
    # Retagged (a statement that sets the tags): its entries follow.
    with api_engine.begin() as conn:
        moved = conn.execute(
            text(
                "UPDATE workflows SET tags = ARRAY[CAST(:t AS varchar)] WHERE id IN (SELECT id "
                "FROM workflows WHERE definition = :d AND tags = ARRAY[CAST(:o AS varchar)] "
                "LIMIT 5) RETURNING id"
            ),
            {"t": two, "d": flow, "o": one},
        ).all()
    assert len(moved) == 5
    for tags in ((one,), (two,), (one, two)):
        assert paged(*tags) == naive(*tags), tags
    # Deleted (as retention does): its entries go with it.
    with api_engine.begin() as conn:
        conn.execute(text("DELETE FROM workflows WHERE definition = :d AND tags @> :t"),
                     {"d": flow, "t": [two]})  # fmt: skip
        left = conn.execute(
            text("SELECT count(*) FROM workflow_tags WHERE tag = :t"), {"t": two}
        ).scalar_one()
    assert left == 0 and paged(two) == [] and paged(one) == naive(one) != []


def test_a_cursor_that_is_not_one_is_refused(api_client: TestClient) -> None:
    for bad in ("nope", "bnxub3Bl", "!!!"):
        response = api_client.get("/api/workflows", params={"cursor": bad})
        assert response.status_code == 422, bad
        assert "next_cursor" in response.json()["detail"]
    assert api_client.get("/api/workflows", params={"offset": 10_001}).status_code == 422


# --- totals ----------------------------------------------------------------------------------


def test_totals_are_exact_where_kept_and_capped_elsewhere(
    api_client: TestClient, api_engine: Engine, big: str
) -> None:
    with api_engine.connect() as conn:
        by_status: dict[str, int] = {
            str(status): int(n)
            for status, n in conn.execute(
                text("SELECT status::text, count(*) FROM workflows GROUP BY status")
            )
        }
        completed = conn.scalar(
            text("SELECT count(*) FROM workflows WHERE definition = :d AND status = 'COMPLETED'"),
            {"d": big},
        )
    everything = _page(api_client, limit=1)
    assert everything["total"] == sum(by_status.values()) and everything["total_exact"]
    failed = _page(api_client, limit=1, status="FAILED")
    assert failed["total"] == by_status["FAILED"] and failed["total_exact"]
    assert completed and completed > repo.COUNT_CAP
    capped = _page(api_client, limit=1, workflow=big, status="COMPLETED")
    assert capped["total"] == repo.COUNT_CAP and not capped["total_exact"]
    assert capped["has_more"]
    small = _page(api_client, limit=1, workflow=big, q=_ids(capped)[0])
    assert small["total"] == 1 and small["total_exact"] and not small["has_more"]


@pytest.mark.parametrize("length", [1, 3, 8, 9, 10, 13, 14, 23, 24, 36])
def test_an_id_prefix_finds_the_runs_whose_id_starts_with_it(
    api_client: TestClient, big: str, length: int
) -> None:
    some = _ids(_page(api_client, workflow=big, limit=5))
    for run_id in some:
        prefix = run_id[:length]
        found = _page(api_client, workflow=big, q=prefix.upper(), limit=200)
        assert run_id in _ids(found) or found["has_more"]
        assert all(i.startswith(prefix) for i in _ids(found))
    assert _page(api_client, q="0000-")["items"] == []  # a hyphen where no id has one


# --- plans -----------------------------------------------------------------------------------


def _plan(session: Session, statement: ClauseElement) -> dict[str, Any]:
    """Postgres's plan of ``statement``, run (``EXPLAIN ANALYZE``: the rows each node read)."""
    compiled = statement.compile(dialect=psycopg_dialect.dialect())  # type: ignore[no-untyped-call]
    explain = f"EXPLAIN (ANALYZE, FORMAT JSON) {compiled.string}"
    params = {k: Jsonb(v) if isinstance(v, dict) else v for k, v in compiled.params.items()}
    rows = session.connection().exec_driver_sql(explain, params).scalar_one()
    plan: dict[str, Any] = rows[0]["Plan"]
    return plan


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def _scans(plan: dict[str, Any], table: str) -> list[dict[str, Any]]:
    return [
        node
        for node in _nodes(plan)
        if node.get("Relation Name") == table
        or node.get("Index Name", "").startswith((f"ix_{table}_", f"pk_{table}"))
    ]


def _reads(plan: dict[str, Any], table: str) -> list[str]:
    """How the plan reads ``table``: its index names, or "Seq Scan"."""
    return [node.get("Index Name") or node["Node Type"] for node in _scans(plan, table)]


def _rows_visited(plan: dict[str, Any], table: str) -> float:
    """Rows the scans of ``table`` produced or threw away."""
    return float(
        sum(
            (node["Actual Rows"] + node.get("Rows Removed by Filter", 0)) * node["Actual Loops"]
            for node in _scans(plan, table)
        )
    )


@pytest.mark.parametrize(
    ("filters", "index"),
    [
        ({}, "ix_workflows_created_at_id"),
        ({"status": WorkflowStatus.CANCELLED}, "ix_workflows_status_created_at_id_tags"),
        ({"definition": "DEF"}, "ix_workflows_definition_created_at_id"),
        ({"policy": Policy.AUTO}, "ix_workflows_policy_created_at_id"),
        ({"created_after": "DAY"}, "ix_workflows_created_at_id"),
        ({"id_prefix": "7"}, None),  # the primary key's range, or the newest-first index
        ({"schedule": "SCHED"}, "ix_workflows_schedule_id_created_at_id"),
        # A tag is walked in its own index (``workflow_tags``), newest first: a page's
        # entries, then their runs by key.
        ({"tags": ("rare-tag",)}, "pk_workflows"),
        # An input is matched by its GIN index (a selective one: its matches, sorted) or along
        # the newest-first index (a common one: about a page's worth).
        ({"input_contains": {"camera": 7}}, None),
    ],
)
def test_every_filter_and_page_reads_an_index_and_only_about_the_page(
    api_sessions: sessionmaker[Session],
    rare: str,
    scheduled: str,
    filters: dict[str, Any],
    index: str | None,
) -> None:
    given: dict[str, Any] = {
        k: {"DEF": rare, "SCHED": scheduled}.get(v, v) if isinstance(v, str) else v
        for k, v in filters.items()
    }
    if given.get("created_after") == "DAY":
        given["created_after"] = datetime.now(UTC) - timedelta(days=1)
    wanted = repo.WorkflowFilter(**given)
    with api_sessions() as session:
        middle = repo.list_workflows(session, wanted, limit=50, offset=200)
        cursor = middle.next
        assert cursor is not None
        # Where the page's keys come from: a tag's own index, or the runs.
        keyed = "workflow_tags" if "tags" in filters else "workflows"
        for at in (None, cursor, repo.Cursor(cursor.created_at, cursor.id, newer=True)):
            plan = _plan(session, page_statement(wanted, at, 50))
            reads = _reads(plan, "workflows")
            assert reads and "Seq Scan" not in reads, (filters, reads)
            if index is not None:
                assert reads == [index], (filters, at, reads)
            if "tags" in filters:  # the tag's newest entries from the cursor, then their runs
                assert _reads(plan, keyed) == ["pk_workflow_tags"], (filters, at, plan)
            if not {"id_prefix", "input_contains"} & set(filters):
                # (a prefix's range, an input's matches are read whole, then sorted)
                assert _rows_visited(plan, keyed) <= 10 * 51, (filters, at, plan)
        # Whether rows lie beyond a page, either way: one row from the cursor in the index.
        for edge in (cursor, repo.Cursor(cursor.created_at, cursor.id, newer=True)):
            plan = _plan(session, beyond_statement(wanted, edge))
            reads = _reads(plan, keyed)
            assert reads and "Seq Scan" not in reads, (filters, edge, reads)
            if not {"id_prefix", "input_contains"} & set(filters):
                assert _rows_visited(plan, keyed) <= 10, (filters, edge, plan)


@pytest.fixture(scope="module")
def triaged(api_engine: Engine, big: str) -> str:
    """A tag that goes with a status, as a history's tags do: on a quarter of ``big``'s
    failed runs and one in fifty of its completed ones (so the planner, which takes tag and
    status as independent, expects far fewer runs with both than there are)."""
    tag = f"triage-{uuid.uuid4().hex[:4]}"
    with api_engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE workflows SET tags = tags || ARRAY[CAST(:t AS varchar)] "
                "WHERE definition = :d AND ((status = 'FAILED' AND get_byte(uuid_send(id), 0) "
                "% 4 = 0) OR (status = 'COMPLETED' AND get_byte(uuid_send(id), 0) % 50 = 0))"
            ),
            {"t": tag, "d": big},
        )
    with api_engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").execute(
            text("VACUUM ANALYZE workflows")
        )
    return tag


def test_a_page_by_status_and_tag_reads_its_keys_from_the_status_index_alone(
    api_sessions: sessionmaker[Session], triaged: str
) -> None:
    wanted = repo.WorkflowFilter(status=WorkflowStatus.FAILED, tags=(triaged,))
    with api_sessions() as session:
        page = repo.list_workflows(session, wanted, limit=50)
        assert len(page.items) == 50 and page.next is not None
        assert all(triaged in w.tags and w.status == WorkflowStatus.FAILED for w in page.items)
        for statement in (page_statement(wanted, None, 50), page_statement(wanted, page.next, 50)):
            plan = _plan(session, statement)
            keys = [n for n in _scans(plan, "workflows") if n.get("Index Name") != "pk_workflows"]
            assert [(n["Node Type"], n.get("Index Name")) for n in keys] == [
                ("Index Only Scan", "ix_workflows_status_created_at_id_tags")
            ], plan
        # A page's keys: about a page's worth of the status's entries, tested in the index.
        assert _rows_visited(_plan(session, page_statement(wanted, None, 50)), "workflows") <= (
            10 * 51
        )


def test_a_window_of_task_runs_reads_the_span_index_however_old_or_empty(
    api_sessions: sessionmaker[Session], big: str
) -> None:
    now = datetime.now(UTC)
    windows = [
        (now - timedelta(days=60), now - timedelta(days=59)),  # before every run: empty
        (now - timedelta(days=15, minutes=5), now - timedelta(days=15)),
        (now - timedelta(minutes=5), now),
    ]
    with api_sessions() as session:
        for after, before in windows:
            plan = _plan(session, task_repo.window_statement(after, before, 0, 200))
            reads = _reads(plan, "task_runs")
            assert "ix_task_runs_ran" in reads and "Seq Scan" not in reads, reads
            assert _rows_visited(plan, "task_runs") <= 1000, plan  # the window's, not 60,000
            found = task_repo.list_task_runs_within(
                session, finished_after=after, started_before=before, limit=1000
            )
            for run in found:
                assert run.started_at is not None and run.finished_at is not None
                assert run.started_at < before and run.finished_at > after
        count = session.scalar(
            text("SELECT count(*) FROM task_runs WHERE started_at < :b AND finished_at > :a"),
            {"a": windows[1][0], "b": windows[1][1]},
        )
        found = task_repo.list_task_runs_within(
            session, finished_after=windows[1][0], started_before=windows[1][1], limit=1000
        )
        assert len(found) == count > 0


def test_a_webhooks_deliveries_page_by_id_each_once_and_from_an_index(
    api_client: TestClient, api_engine: Engine, api_sessions: sessionmaker[Session]
) -> None:
    name = f"hook_{uuid.uuid4().hex[:6]}"
    with api_engine.begin() as conn:
        conn.execute(
            text(
                "WITH h AS (INSERT INTO webhooks (id, name, url, secret, events) VALUES "
                "(gen_random_uuid(), :n, 'http://127.0.0.1:9/', 's', '{workflow.failed}') "
                "RETURNING id) "
                "INSERT INTO webhook_deliveries (webhook_id, event, payload, status) "
                "SELECT h.id, 'workflow.failed', '{}', CASE WHEN i % 10 = 0 THEN 'FAILED' "
                "ELSE 'DELIVERED' END::delivery_status FROM h, generate_series(1, 3000) i"
            ),
            {"n": name},
        )
        every = list(conn.scalars(text("SELECT d.id FROM webhook_deliveries d JOIN webhooks w "
                                       "ON w.id = d.webhook_id WHERE w.name = :n "
                                       "AND d.status = 'FAILED' ORDER BY d.id DESC"),
                                  {"n": name}))  # fmt: skip
    seen: list[int] = []
    params: dict[str, Any] = {"status": "FAILED", "limit": 40}
    while True:
        page = api_client.get(f"/api/webhooks/{name}/deliveries", params=params).json()
        assert page["total"] == len(every) == 300 and page["total_exact"]
        seen += [d["id"] for d in page["items"]]
        if page["next_before_id"] is None:
            assert not page["has_more"]
            break
        params["before_id"] = page["next_before_id"]
    assert seen == every  # newest first, each once
    with api_sessions() as session:
        hook = repo.get_webhook(session, name)
        plan = _plan(
            session,
            text(
                f"SELECT * FROM webhook_deliveries WHERE webhook_id = '{hook.id}' "
                f"AND status = 'FAILED' AND id < {every[100]} ORDER BY id DESC LIMIT 41"
            ),
        )
    assert _reads(plan, "webhook_deliveries") == ["ix_webhook_deliveries_webhook_id_status_id"]
