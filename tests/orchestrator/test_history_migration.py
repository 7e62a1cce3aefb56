"""Migrations 0010 to 0014 on a database with history: their indexes built (concurrently)
and valid, the ones they replace gone, the counts by status backfilled equal to the rows, the
kept minutes summed by hour and each one summarised, every run's tags indexed, the task runs'
spans given statistics; down and up again cleanly."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from alembic import command
from sqlalchemy import Connection, text

from orchestrator.db import make_engine, migrate, tallies
from orchestrator.db.migrate import alembic_config
from orchestrator.db.repository.task_runs import _RAN

_NEW = ("ix_workflows_created_at_id", "ix_workflows_status_created_at_id",
        "ix_workflows_definition_created_at_id", "ix_workflows_policy_created_at_id",
        "ix_workflows_schedule_id_created_at_id", "ix_workflows_definition_finished_at",
        "ix_workflows_retry_of", "ix_task_runs_ran", "ix_handoffs_task_run_id",
        "ix_webhook_deliveries_webhook_id_status_id",
        "ix_webhook_deliveries_workflow_id")  # fmt: skip
_OLD = ("ix_workflows_created_at", "ix_workflows_status_created_at",
        "ix_workflows_definition_created_at")  # fmt: skip


def _to(conn: Connection, revision: str, *, down: bool = False) -> None:
    config = alembic_config()
    config.attributes["connection"] = conn
    (command.downgrade if down else command.upgrade)(config, revision)


def _indexes(conn: Connection) -> dict[str, bool]:
    rows = conn.execute(
        text(
            "SELECT c.relname, i.indisvalid FROM pg_index i JOIN pg_class c "
            "ON c.oid = i.indexrelid WHERE c.relname LIKE 'ix_%'"
        )
    )
    return {str(name): bool(valid) for name, valid in rows}


def _history(conn: Connection) -> None:
    """Runs of every status over three days, each with two task runs, written at 0009."""
    conn.execute(
        text(
            "INSERT INTO workflow_definitions (name, tasks) VALUES ('old_flow', '[]');"
            "INSERT INTO workflow_definition_versions (name, version, tasks) "
            "VALUES ('old_flow', 1, '[]')"
        )
    )
    conn.execute(
        text(
            "INSERT INTO workflows (id, definition, definition_version, status, policy, "
            "data_plane, input, created_at, finished_at) "
            "SELECT gen_random_uuid(), 'old_flow', 1, "
            "(ARRAY['PENDING','RUNNING','COMPLETED','FAILED','CANCELLED','TIMED_OUT'])[1 + i % 6]"
            "::workflow_status, 'affinity', 'cdi', '{}', "
            "now() - i * interval '1 minute', "
            "CASE WHEN i % 6 >= 2 THEN now() - i * interval '1 minute' + interval '2 s' END "
            "FROM generate_series(1, 4000) i"
        )
    )
    conn.execute(
        text(
            "INSERT INTO task_runs (workflow_id, ref, task, attempt, status) "
            "SELECT id, r, 'noop', 1, CASE WHEN status = 'COMPLETED' THEN 'COMPLETED' "
            "ELSE 'QUEUED' END::task_run_status "
            "FROM workflows, unnest(ARRAY['a', 'b']) r"
        )
    )


def _folded_history(conn: Connection, revision: str) -> None:
    """The history written at 0009, then upgraded to ``revision`` and its figures folded (the
    last two days' ends, per minute)."""
    _to(conn, "0009")
    _history(conn)
    conn.commit()
    _to(conn, revision)
    while tallies.fold(conn).moved == tallies.FOLD_BATCH:  # a batch a statement, until none
        pass
    conn.commit()


def test_0010_upgrades_a_history_concurrently_and_back(
    make_database: Callable[[str], str],
) -> None:
    url = make_database("upgrade")
    engine = make_engine(url, pooled=False)
    try:
        with engine.connect() as conn:
            _to(conn, "0009")
            _history(conn)
            conn.commit()
            assert set(_OLD) <= set(_indexes(conn))
            conn.commit()
            _to(conn, "0010")
            conn.commit()
            found = _indexes(conn)
            assert all(found.get(name) for name in _NEW), found  # present and valid
            assert not set(_OLD) & set(found)
            kept = tallies.counts(conn, "")
            for table in ("workflows", "task_runs"):
                rows = conn.execute(text(f"SELECT status::text, count(*) FROM {table} GROUP BY 1"))
                assert {f"{table}:{s}": n for s, n in rows} == {
                    k: v for k, v in kept.items() if k.startswith(f"{table}:")
                }
            # By status and definition too (``/metrics``' ``workflow`` label).
            rows = conn.execute(text("SELECT status::text, count(*) FROM workflows GROUP BY 1"))
            assert {f"workflow:{s}:old_flow": n for s, n in rows} == {
                k: v for k, v in kept.items() if k.startswith("workflow:")
            }
            # The last two days' ends per minute are there; the all-time histograms start now.
            assert kept.get("ended:COMPLETED") is None
            ended = conn.scalar(
                text("SELECT sum(n) FROM tally_deltas WHERE series = 'ended:COMPLETED'")
            )
            recent = conn.scalar(
                text("SELECT count(*) FROM workflows WHERE status = 'COMPLETED' "
                     "AND finished_at >= now() - interval '2 days'")
            )  # fmt: skip
            assert ended == recent > 0
            conn.commit()  # Alembic runs each revision in a transaction of its own
            _to(conn, "0009", down=True)
            found = _indexes(conn)
            assert all(found.get(name) for name in _OLD) and not set(_NEW) & set(found)
            assert conn.scalar(text("SELECT to_regclass('tallies')")) is None
            conn.commit()
            _to(conn, "0010")
            conn.commit()
            assert set(_NEW) <= set(_indexes(conn))
    finally:
        engine.dispose()


def test_0011_swaps_the_status_index_and_sums_the_kept_minutes_by_hour(
    make_database: Callable[[str], str],
) -> None:
    url = make_database("hours")
    engine = make_engine(url, pooled=False)
    by_hour = (
        "SELECT date_trunc('hour', minute, 'UTC'), series, bucket, sum(n), max(peak) "
        "FROM tallies WHERE minute > '-infinity' GROUP BY 1, 2, 3 ORDER BY 1, 2, 3"
    )
    hours = "SELECT hour, series, bucket, n, peak FROM tally_hours ORDER BY 1, 2, 3"
    try:
        with engine.connect() as conn:
            _folded_history(conn, "0010")
            minutes = conn.execute(text(by_hour)).all()
            assert len({row[0] for row in minutes}) > 24  # hours of two days
            conn.commit()
            _to(conn, "0011")
            found = _indexes(conn)
            assert found.get("ix_workflows_status_created_at_id_tags")
            assert "ix_workflows_status_created_at_id" not in found
            assert conn.execute(text(hours)).all() == minutes
            conn.commit()
            _to(conn, "0010", down=True)
            found = _indexes(conn)
            assert found.get("ix_workflows_status_created_at_id")
            assert "ix_workflows_status_created_at_id_tags" not in found
            assert conn.scalar(text("SELECT to_regclass('tally_hours')")) is None
            conn.commit()
        assert migrate(url) == "0014"
    finally:
        engine.dispose()


def test_0012_sums_each_kept_minute_and_back(make_database: Callable[[str], str]) -> None:
    url = make_database("minutes")
    engine = make_engine(url, pooled=False)
    live = (
        "SELECT minute, "
        "coalesce(sum(n) FILTER (WHERE series = 'ended:COMPLETED'), 0), "
        "coalesce(sum(n) FILTER (WHERE series IN ('ended:FAILED', 'ended:CANCELLED', "
        "'ended:TIMED_OUT')), 0), coalesce(sum(n) FILTER (WHERE series = 'created'), 0) "
        "FROM tallies WHERE minute >= now() - interval '1 day' AND bucket = -1 "
        "AND (series = 'created' OR series LIKE 'ended:%') GROUP BY 1 ORDER BY 1"
    )
    # (the longest window's day: at the edge of the two kept, a minute may be left unsummed)
    summed = (
        "SELECT minute, completed, failed, created FROM tally_minutes "
        "WHERE minute >= now() - interval '1 day' ORDER BY 1"
    )
    try:
        with engine.connect() as conn:
            _folded_history(conn, "0011")
            minutes = conn.execute(text(live)).all()
            assert len(minutes) > 23 * 60  # a day's minutes with runs ended
            conn.commit()
            _to(conn, "0012")
            assert conn.execute(text(summed)).all() == minutes
            conn.commit()
            _to(conn, "0011", down=True)
            assert conn.scalar(text("SELECT to_regclass('tally_minutes')")) is None
            conn.commit()
        assert migrate(url) == "0014"
    finally:
        engine.dispose()


def test_0013_indexes_every_runs_tags_and_back(make_database: Callable[[str], str]) -> None:
    url = make_database("tags")
    engine = make_engine(url, pooled=False)
    unnested = "SELECT t, created_at, id FROM workflows, unnest(tags) t ORDER BY 1, 2, 3"
    kept = "SELECT tag, created_at, workflow_id FROM workflow_tags ORDER BY 1, 2, 3"
    try:
        with engine.connect() as conn:
            _folded_history(conn, "0012")
            conn.execute(
                text(
                    "UPDATE workflows SET tags = CASE WHEN get_byte(uuid_send(id), 0) % 3 = 0 "
                    "THEN ARRAY['a', 'b'] ELSE ARRAY['a'] END::varchar[] "
                    "WHERE get_byte(uuid_send(id), 1) % 2 = 0"
                )
            )
            conn.commit()
            _to(conn, "0013")
            tagged = conn.execute(text(kept)).all()
            assert len(tagged) > 2000 and tagged == conn.execute(text(unnested)).all()
            assert "ix_workflows_tags" not in _indexes(conn)
            conn.commit()
            _to(conn, "0012", down=True)
            assert conn.scalar(text("SELECT to_regclass('workflow_tags')")) is None
            assert _indexes(conn).get("ix_workflows_tags")
            conn.commit()
        assert migrate(url) == "0014"
    finally:
        engine.dispose()


def _overlap_estimate(conn: Connection, low: datetime, high: datetime) -> float:
    """The planner's estimate of the task runs whose span (as the repository spells it) meets
    ``[low, high]``."""
    ran = str(_RAN.compile(dialect=conn.dialect))
    plan = conn.scalar(
        text(
            f"EXPLAIN (FORMAT JSON) SELECT id FROM task_runs WHERE {ran} && "
            f"tstzrange('{low.isoformat()}', '{high.isoformat()}', '[]')"
        )
    )
    return float(plan[0]["Plan"]["Plan Rows"])


def test_0014_gives_the_planner_the_spans_task_runs_ran(
    make_database: Callable[[str], str],
) -> None:
    url = make_database("spans")
    engine = make_engine(url, pooled=False)
    now = datetime.now(UTC)
    long_ago = (now - timedelta(days=400), now - timedelta(days=400) + timedelta(minutes=5))
    last_day = (now - timedelta(days=1), now)
    try:
        with engine.connect() as conn:
            _folded_history(conn, "0013")
            # Each of the 8,000 task runs ran 2 s, evenly over the last 5.6 days.
            conn.execute(
                text(
                    "UPDATE task_runs SET started_at = now() - id * interval '1 minute', "
                    "finished_at = now() - id * interval '1 minute' + interval '2 s'"
                )
            )
            conn.execute(text("ANALYZE task_runs"))
            rows = conn.scalar(text("SELECT count(*) FROM task_runs"))
            in_last_day = conn.scalar(
                text("SELECT count(*) FROM task_runs WHERE finished_at >= now() - interval '1 day'")
            )
            # Without: the default 1 % of the table for any window (the partial index's
            # statistics are not used for selectivity).
            assert _overlap_estimate(conn, *long_ago) == pytest.approx(rows / 100, rel=0.05)
            conn.commit()
            _to(conn, "0014")
            assert _overlap_estimate(conn, *long_ago) <= 2
            assert _overlap_estimate(conn, *last_day) == pytest.approx(in_last_day, rel=0.25)
            conn.commit()
            _to(conn, "0013", down=True)
            assert _overlap_estimate(conn, *last_day) == pytest.approx(rows / 100, rel=0.05)
            conn.commit()
        assert migrate(url) == "0014"
    finally:
        engine.dispose()
