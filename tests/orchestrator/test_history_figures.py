"""Figures kept as runs change (``db.tallies``): after runs go through the scheduler's and the
API's own statements, every count, histogram and per-minute figure equals a count of the rows;
folding changes nothing; pruning keeps the counts by status equal to the rows and the
histograms as they were."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from orchestrator.contract.messages import Report
from orchestrator.contract.vocabulary import TaskRunStatus, WorkflowStatus
from orchestrator.db import tallies
from orchestrator.db.run_statements import Finish, Handoff, Placement
from orchestrator.db.scheduler_store import SchedulerStore
from orchestrator.retention import Pruner
from orchestrator.settings import Settings

ME = "scheduler-figures"


@pytest.fixture(scope="module")
def api_settings(api_settings: Settings) -> Settings:
    """The module's app without a retention pass of its own (the tests run theirs)."""
    return api_settings.model_copy(update={"retention_interval_s": 86_400.0})


def _start(api_client: TestClient, flow: str) -> uuid.UUID:
    reply = api_client.post("/api/workflows", json={"workflow": flow, "input": {}})
    assert reply.status_code == 201, reply.text
    return uuid.UUID(reply.json()["id"])


def _place(store: SchedulerStore, run: uuid.UUID, ref: str, attempt: int = 1) -> int:
    task_run = store.next_task_run_id()
    moved = (Handoff("scheduler", "worker-f", 1000 + attempt, 7.0),)
    store.place([Placement(task_run, run, ref, "noop", attempt, "worker-f", time.time(),
                           handoffs=moved)])  # fmt: skip
    return task_run


def _report(run: uuid.UUID, task_run: int, status: TaskRunStatus, run_s: float) -> Report:
    began = time.time()
    return Report(task_run, str(run), "worker-f", status, began, began + run_s)


def drive(api_client: TestClient, store: SchedulerStore, flow: str) -> dict[str, list[uuid.UUID]]:
    """Runs through every statement that changes a status: started, claimed, placed,
    reported, finished (completed, failed, cancelled), lost; some left pending or running."""
    runs = [_start(api_client, flow) for _ in range(14)]
    claimed = {c.id for c in store.claim(ME, 100, 60.0)}
    assert set(runs[:12]) <= claimed
    out: dict[str, list[uuid.UUID]] = {"completed": [], "failed": [], "cancelled": [],
                                       "running": [runs[12], runs[13]]}  # fmt: skip
    for i, run in enumerate(runs[:12]):
        first = _place(store, run, "a")
        if i % 4 == 0:  # a, then b, completed
            store.report(_report(run, first, TaskRunStatus.COMPLETED, 0.02 * (i + 1)))
            second = _place(store, run, "b")
            done = Finish(run, WorkflowStatus.COMPLETED, output={"n": i})
            assert store.report(_report(run, second, TaskRunStatus.COMPLETED, 0.3), finish=done)
            out["completed"].append(run)
        elif i % 4 == 1:  # a fails, a retry completes, then the run
            store.report(_report(run, first, TaskRunStatus.FAILED, 0.01))
            again = _place(store, run, "a", attempt=2)
            done = Finish(run, WorkflowStatus.COMPLETED)
            assert store.report(_report(run, again, TaskRunStatus.COMPLETED, 1.5), finish=done)
            out["completed"].append(run)
        elif i % 4 == 2:  # cancelled by a user while its task waits
            assert api_client.post(f"/api/workflows/{run}/cancel").status_code == 200
            store.unqueue(run)
            out["cancelled"].append(run)
        else:  # its worker is lost, and the run fails
            store.task_run_lost(first, "worker-f went silent")
            assert store.finish(Finish(run, WorkflowStatus.FAILED, error="lost"))
            out["failed"].append(run)
    _place(store, runs[12], "a")  # running, its task queued
    return out


def _counted(api_engine: Engine, query: str) -> dict[Any, int]:
    """The query's last column by the others (one of them: by its value)."""
    with api_engine.connect() as conn:
        rows = [tuple(row) for row in conn.execute(text(query))]
    return {(row[0] if len(row) == 2 else row[:-1]): int(row[-1]) for row in rows}


def recount(api_engine: Engine) -> dict[str, Any]:
    """Every figure counted from the rows, in the tallies' words."""
    return {
        "workflows": _counted(
            api_engine, "SELECT status::text, count(*) FROM workflows GROUP BY 1"
        ),
        "task_runs": _counted(
            api_engine, "SELECT status::text, count(*) FROM task_runs GROUP BY 1"
        ),
        "ended": _counted(
            api_engine,
            "SELECT status::text, count(*) FROM workflows "
            "WHERE status IN ('COMPLETED', 'FAILED', 'CANCELLED') GROUP BY 1",
        ),
        "latency": _counted(
            api_engine,
            "SELECT history_bucket(extract(epoch FROM finished_at - created_at) * 1000), "
            "count(*) FROM workflows WHERE status = 'COMPLETED' GROUP BY 1",
        ),
        "run:noop": _counted(
            api_engine,
            "SELECT history_bucket(run_ms), count(*) FROM task_runs "
            "WHERE status = 'COMPLETED' AND run_ms IS NOT NULL GROUP BY 1",
        ),
        "queue_wait": _counted(
            api_engine,
            "SELECT history_bucket(queue_wait_ms), count(*) FROM task_runs "
            "WHERE queue_wait_ms IS NOT NULL AND finished_at IS NOT NULL GROUP BY 1",
        ),
        "handoffs": _counted(api_engine, "SELECT 'all', count(*) FROM handoffs")["all"],
        "handoff_bytes": _counted(
            api_engine, "SELECT 'all', coalesce(sum(bytes), 0) FROM handoffs"
        )["all"],
        "per_minute": _counted(
            api_engine,
            "SELECT date_trunc('minute', finished_at), 'ended:' || status, count(*) "
            "FROM workflows WHERE status IN ('COMPLETED', 'FAILED', 'CANCELLED') GROUP BY 1, 2 "
            "UNION ALL SELECT date_trunc('minute', created_at), 'created', count(*) "
            "FROM workflows GROUP BY 1 "
            "UNION ALL SELECT date_trunc('minute', finished_at), 'task_finished', count(*) "
            "FROM task_runs WHERE finished_at IS NOT NULL GROUP BY 1",
        ),
    }


def kept(api_engine: Engine) -> dict[str, Any]:
    """The same figures as the tallies keep them."""
    with api_engine.connect() as conn:
        all_time = tallies.all_time(conn)
        minutes = tallies.per_minute(conn, datetime(2000, 1, 1, tzinfo=UTC))

    def histogram(series: str) -> dict[int, int]:
        return {b: n for b, n in all_time.histogram(series).counts.items() if n}

    per_minute: dict[tuple[datetime, str], int] = {}
    for minute, tally in minutes.items():
        for series, n in tally.counts.items():
            if n and series.startswith(("ended:", "created", "task_finished")):
                per_minute[(minute, series)] = n
    return {
        "workflows": {k: v for k, v in all_time.with_prefix("workflows:").items() if v},
        "task_runs": {k: v for k, v in all_time.with_prefix("task_runs:").items() if v},
        "ended": {k: v for k, v in all_time.with_prefix("ended:").items() if v},
        "latency": histogram("latency"),
        "run:noop": histogram("run:noop"),
        "queue_wait": histogram("queue_wait"),
        "handoffs": all_time.count("handoffs"),
        "handoff_bytes": int(all_time.sums.get("handoffs", 0)),
        "per_minute": per_minute,
    }


def test_the_figures_equal_a_recount_after_runs_end_fold_and_are_pruned(
    api_client: TestClient, api_store: SchedulerStore, api_settings: Settings, api_engine: Engine,
    flow: str,
) -> None:  # fmt: skip
    # The fold lock held from before the runs end: housekeeping folds none of their deltas.
    with api_engine.begin() as held:
        held.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": tallies.FOLD_LOCK})
        runs = drive(api_client, api_store, flow)
        before_fold = kept(api_engine)
        assert before_fold == recount(api_engine)
        assert before_fold["ended"] == {"COMPLETED": 6, "FAILED": 3, "CANCELLED": 3}
        assert tallies.fold(held).written > 0
    with api_engine.connect() as conn:
        assert conn.scalar(text("SELECT count(*) FROM tally_deltas")) == 0
    assert kept(api_engine) == before_fold

    # Half the finished runs ended 40 days ago: the default retention (30 days) prunes them.
    old = runs["completed"][:3] + runs["failed"][:1] + runs["cancelled"][:2]
    with api_engine.begin() as conn:
        conn.execute(
            text("UPDATE workflows SET finished_at = now() - interval '40 days' "
                 "WHERE id = ANY(:ids)"),
            {"ids": old},
        )  # fmt: skip
    report = Pruner(api_engine, api_settings).run_pass()
    assert report.error is None and report.pruned == len(old)
    after = kept(api_engine)
    counted = recount(api_engine)
    for figure in ("workflows", "task_runs"):  # what is on record: as the rows say
        assert after[figure] == counted[figure], figure
    for figure in ("ended", "latency", "run:noop", "queue_wait", "handoffs"):  # what happened
        assert after[figure] == before_fold[figure], figure
    with api_engine.connect() as conn:
        assert tallies.counts(conn, "")["pruned"] == len(old)
        assert (
            conn.scalar(text("SELECT count(*) FROM workflows WHERE id = ANY(:ids)"), {"ids": old})
            == 0
        )


def test_a_backlog_is_folded_a_bounded_batch_at_a_time_each_after_the_last(
    api_client: TestClient, api_store: SchedulerStore, api_engine: Engine, flow: str
) -> None:
    drive(api_client, api_store, flow)
    before = kept(api_engine)
    moved: list[int] = []
    lasts: list[tuple[int, int]] = []
    with api_engine.begin() as conn:
        conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": tallies.FOLD_LOCK})
        waiting = conn.scalar(text("SELECT count(*) FROM tally_deltas"))
        assert waiting is not None and waiting > 6
        after = None
        while not moved or moved[-1] == 3:
            done = tallies.fold(conn, after=after, batch=3)
            moved.append(done.moved)
            if done.last is not None:
                page, row = done.last.strip("()").split(",")
                lasts.append((int(page), int(row)))
            after = done.last
        assert conn.scalar(text("SELECT count(*) FROM tally_deltas")) == 0
    assert sum(moved) == waiting and max(moved) == 3  # every delta, none twice, 3 a statement
    assert lasts == sorted(set(lasts))  # each batch starts after the last one's rows
    assert kept(api_engine) == before  # folding changes no figure


def test_a_windows_counts_and_percentiles_are_the_database_walk_of_the_same_rows(
    api_client: TestClient, api_store: SchedulerStore, api_engine: Engine, flow: str
) -> None:
    drive(api_client, api_store, flow)
    since = datetime(2000, 1, 1, tzinfo=UTC)
    with api_engine.connect() as conn:
        by_minute = tallies.per_minute(conn, since)
        walked = tallies.minute_quantiles(conn, since, "latency", (0.25, 0.5, 0.95, 1.0))
        summed = tallies.window_histograms(conn, since, ["latency", "task_run"])
        counted = tallies.window_counts(conn, since)
    assert counted and counted == {m: dict(t.counts) for m, t in by_minute.items() if t.counts}
    assert walked
    for minute, found in walked.items():
        histogram = by_minute[minute].histogram("latency")
        for share, value in found.items():
            assert value == pytest.approx(histogram.quantile(share)), (minute, share)
    merged = tallies.Histogram()
    for tally in by_minute.values():
        merged.merge(tally.histogram("latency"))
    assert summed["latency"].counts == {b: n for b, n in merged.counts.items() if n}
    assert summed["latency"].peak == merged.peak


def test_the_bucket_bounds_are_the_same_in_python_and_postgres(api_engine: Engine) -> None:
    with api_engine.connect() as conn:
        assert tuple(conn.scalar(text("SELECT history_ms_bounds()"))) == tallies.MS_BOUNDS
        for i, bound in enumerate(tallies.MS_BOUNDS):  # a bound's value is in its bucket
            assert conn.scalar(text("SELECT history_bucket(:v)"), {"v": bound}) == i
            above = conn.scalar(text("SELECT history_bucket(:v)"), {"v": bound * 1.0001})
            assert above == i + 1
        assert conn.scalar(text("SELECT history_bucket(0)")) == 0


def test_a_histogram_reads_percentiles_within_a_bucket_and_never_above_the_largest() -> None:
    histogram = tallies.Histogram()
    values = [12.0, 13.5, 14.0, 40.0, 41.0, 950.0]
    for value in values:
        bucket = sum(1 for b in tallies.MS_BOUNDS if b < value)
        histogram.add(bucket, 1, value, value)
    assert histogram.count == 6 and histogram.total == sum(values)
    median = histogram.quantile(0.5)
    assert median is not None and 13 <= median <= 14
    assert histogram.quantile(1.0) == 950.0 and histogram.peak == 950.0
    assert histogram.at_or_under(14) == 3 and histogram.at_or_under(50) == 5
    with pytest.raises(ValueError, match="bucket bound"):
        histogram.at_or_under(13.7)
    assert tallies.Histogram().quantile(0.5) is None
