"""The scheduler's loop turn (``orchestrator.scheduler.loop``): the reports it takes together are
written in one transaction with what they lead to (group commit), the runs they end included,
which are told only once that is committed; and a scheduler that dies mid-turn loses none of
the reports it took: its next process records them as it starts."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient
from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from orchestrator.contract import keys
from orchestrator.contract.messages import Instruction, Report
from orchestrator.contract.vocabulary import TaskRunStatus
from orchestrator.db import run_statements as sql
from orchestrator.db.scheduler_store import _native
from orchestrator.scheduler.loop import Scheduler
from orchestrator.settings import Settings
from tests.orchestrator.scheduler_support import beat, close_scheduler, make_scheduler

RUNS = 6
WORKERS = [f"worker-turn-{i}" for i in range(RUNS)]


class Killed(BaseException):
    """The process ends here, as on SIGKILL: nothing after this point runs."""


def _first_tasks_out(
    scheduler: Scheduler, api_client: TestClient, api_redis: redis.Redis
) -> list[Report]:
    """``RUNS`` workflows of three no-op steps claimed, each first task out at a live worker;
    the reports of those tasks, completed, as their workers would send them."""
    for worker in WORKERS:
        beat(api_redis, started_at=1000.0, worker=worker)
        api_redis.delete(keys.worker_queue_key(worker))
    body = {"workflow": "noop_pipeline", "input": {"data": {}}, "policy": "transfer"}
    ids = []
    for _ in range(RUNS):
        started = api_client.post("/api/workflows", json=body)
        assert started.status_code == 201, started.text
        ids.append(started.json()["id"])
    api_redis.delete(keys.WAKE)  # the starts' wake-ups: the claim below takes them all
    scheduler.claims.claim()
    now = time.time()
    reports = [
        Report(ins.task_run_id, ins.workflow_id, worker, TaskRunStatus.COMPLETED, now - 0.1, now)
        for worker in WORKERS
        for ins in map(Instruction.loads, api_redis.lrange(keys.worker_queue_key(worker), 0, -1))
    ]
    assert sorted(r.workflow_id for r in reports) == sorted(ids)
    return reports


def _task_runs(api_sessions: sessionmaker[Session], reports: list[Report]) -> list[dict[str, Any]]:
    ids = [uuid.UUID(r.workflow_id) for r in reports]
    with api_sessions() as session:
        rows = session.execute(
            text(
                "SELECT id, ref, status::text AS status, worker_id, error, "
                "xmin::text AS xid FROM task_runs WHERE workflow_id = ANY(:ids)"
            ),
            {"ids": ids},
        )
        return [dict(row._mapping) for row in rows]


def _last_event(api_sessions: sessionmaker[Session]) -> int:
    with api_sessions() as session:
        return int(session.execute(text("SELECT coalesce(max(id), 0) FROM events")).one()[0])


def _event_xids(api_sessions: sessionmaker[Session], after: int) -> list[str]:
    """The transaction of each event written since event ``after``."""
    with api_sessions() as session:
        rows = session.execute(
            text("SELECT xmin::text FROM events WHERE id > :after ORDER BY id"), {"after": after}
        )
        return [str(row[0]) for row in rows]


def test_the_reports_a_turn_takes_are_written_in_one_transaction(
    scheduler: Scheduler,
    api_client: TestClient,
    api_sessions: sessionmaker[Session],
    api_redis: redis.Redis,
) -> None:
    reports = _first_tasks_out(scheduler, api_client, api_redis)
    for report in reports:
        api_redis.lpush(scheduler.reply_key, report.dumps())

    last_event = _last_event(api_sessions)
    scheduler.step()

    assert api_redis.llen(scheduler.reply_key) == 0
    assert api_redis.llen(scheduler.ctx.taken_key) == 0, "the turn's reports were not trimmed"
    rows = _task_runs(api_sessions, reports)
    first = {r.task_run_id for r in reports}
    assert sorted(row["status"] for row in rows if row["id"] in first) == ["COMPLETED"] * RUNS
    nexts = [row for row in rows if row["id"] not in first]
    assert [row["ref"] for row in nexts] == ["noop2"] * RUNS
    # The reports' outcomes, the next steps' task runs and every event the turn wrote (one a
    # report): one transaction (a row's xmin), so one commit and one WAL flush for the turn.
    events = _event_xids(api_sessions, last_event)
    assert len(events) >= RUNS
    assert len({row["xid"] for row in rows} | set(events)) == 1, (rows, events)


def test_a_scheduler_killed_mid_turn_loses_none_of_the_reports_it_took(
    api_settings: Settings,
    api_client: TestClient,
    api_sessions: sessionmaker[Session],
    api_redis: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    own = make_scheduler(api_settings)
    try:
        reports = _first_tasks_out(own, api_client, api_redis)
        for report in reports:
            api_redis.lpush(own.reply_key, report.dumps())

        def killed(*, commit: bool) -> bool:
            raise Killed

        monkeypatch.setattr(own, "_end_turn", killed)  # dies as its turn's writes are done
        with pytest.raises(Killed):
            own.step()
    finally:
        close_scheduler(own)  # its connection goes: Postgres rolls the open turn back

    first = {r.task_run_id for r in reports}
    rows = _task_runs(api_sessions, reports)
    assert sorted(row["status"] for row in rows if row["id"] in first) == ["QUEUED"] * RUNS
    assert api_redis.llen(own.reply_key) == 0
    assert api_redis.llen(own.ctx.taken_key) == RUNS, "the reports taken left Redis"

    again = make_scheduler(api_settings, own.id)
    try:
        again.start_up()
    finally:
        close_scheduler(again)

    assert api_redis.llen(again.ctx.taken_key) == 0
    by_id = {row["id"]: row for row in _task_runs(api_sessions, reports)}
    for report in reports:
        row = by_id[report.task_run_id]
        assert (row["status"], row["worker_id"], row["error"]) == (
            "COMPLETED",
            report.worker_id,
            None,
        ), row


def _one_task_runs_out(
    scheduler: Scheduler, api_client: TestClient, api_redis: redis.Redis, count: int
) -> list[str]:
    """``count`` runs of one no-op task each, claimed and out at live workers, their reports
    (completed) waiting for the scheduler: each report ends its run. Their ids."""
    name = f"one_noop_{uuid.uuid4().hex[:8]}"
    registered = api_client.post(
        "/api/workflow-definitions", json={"name": name, "tasks": [{"ref": "n", "task": "noop"}]}
    )
    assert registered.status_code == 201, registered.text
    for worker in WORKERS:
        beat(api_redis, started_at=1000.0, worker=worker)
        api_redis.delete(keys.worker_queue_key(worker))
    body = {"workflow": name, "input": {"data": {}}, "policy": "transfer"}
    ids = [api_client.post("/api/workflows", json=body).json()["id"] for _ in range(count)]
    api_redis.delete(keys.WAKE)
    scheduler.claims.claim()
    now = time.time()
    for worker in WORKERS:
        for raw in api_redis.lrange(keys.worker_queue_key(worker), 0, -1):
            ins = Instruction.loads(raw)
            done = Report(ins.task_run_id, ins.workflow_id, worker, TaskRunStatus.COMPLETED,
                          now - 0.1, now)  # fmt: skip
            api_redis.lpush(scheduler.reply_key, done.dumps())
    assert api_redis.llen(scheduler.reply_key) == count
    return ids


def _ended_in(api_sessions: sessionmaker[Session], ids: list[str]) -> dict[str, str]:
    """The transaction that wrote each run's end (its ``workflow.completed`` event)."""
    with api_sessions() as session:
        rows = session.execute(
            text(
                "SELECT workflow_id::text, xmin::text FROM events "
                "WHERE kind = 'workflow.completed' AND workflow_id = ANY(:ids)"
            ),
            {"ids": [uuid.UUID(i) for i in ids]},
        )
        return {str(row[0]): str(row[1]) for row in rows}


def _status_at_announcement(
    api_sessions: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch
) -> dict[str, str]:
    """Each announced run's status as a reader outside the scheduler sees it at the
    announcement (filled in as the scheduler announces)."""
    seen: dict[str, str] = {}

    def announce(client: redis.Redis, workflow_id: uuid.UUID) -> None:
        with api_sessions() as session:
            status = session.execute(
                text("SELECT status::text FROM workflows WHERE id = :id"), {"id": workflow_id}
            ).one()[0]
        seen[str(workflow_id)] = str(status)

    monkeypatch.setattr("orchestrator.scheduler.endings.announce_finished", announce)
    return seen


def test_the_runs_a_turn_ends_share_its_one_commit_and_are_told_after_it(
    scheduler: Scheduler,
    api_client: TestClient,
    api_sessions: sessionmaker[Session],
    api_redis: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Runs of one task each: every report of the batch ends a run. The ends, the reports
    that made them and the claim of a run that was waiting go in one transaction (one commit,
    one WAL flush for the turn); each end is announced only after that commit (a reader
    outside the scheduler then sees it ended)."""
    ids = _one_task_runs_out(scheduler, api_client, api_redis, RUNS)
    scheduler.ctx.tick.at = time.monotonic() + 60  # the tick is not due in this turn
    waiting = api_client.post("/api/workflows", json={"workflow": "noop_pipeline", "input": {}})
    assert waiting.status_code == 201, waiting.text  # its wake-up is taken with the reports
    seen = _status_at_announcement(api_sessions, monkeypatch)
    last_event = _last_event(api_sessions)

    scheduler.step()

    assert seen == dict.fromkeys(ids, "COMPLETED")
    ended = _ended_in(api_sessions, ids)
    assert sorted(ended) == sorted(ids)
    events = _event_xids(api_sessions, last_event)  # reports, ends, the claim, its first step
    assert len(events) >= 2 * RUNS + 1
    assert set(events) == set(ended.values()) and len(set(events)) == 1, events
    assert api_redis.llen(scheduler.ctx.taken_key) == 0
    assert uuid.UUID(waiting.json()["id"]) in scheduler.runs


def test_the_ends_a_turn_told_are_committed_before_its_tick(
    scheduler: Scheduler,
    api_client: TestClient,
    api_sessions: sessionmaker[Session],
    api_redis: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A turn whose tick is due commits the runs it ended, together, and tells them before
    the tick's housekeeping runs: an end never waits for it."""
    ids = _one_task_runs_out(scheduler, api_client, api_redis, RUNS)
    seen = _status_at_announcement(api_sessions, monkeypatch)
    told_at_tick: list[dict[str, str]] = []
    tick = scheduler._tick

    def noting_tick() -> None:
        told_at_tick.append(dict(seen))
        tick()

    monkeypatch.setattr(scheduler, "_tick", noting_tick)
    scheduler.ctx.tick.at = 0.0  # due

    scheduler.step()

    assert told_at_tick == [dict.fromkeys(ids, "COMPLETED")]
    assert len(set(_ended_in(api_sessions, ids).values())) == 1


def test_a_scheduler_killed_before_its_turn_commits_tells_no_end(
    api_settings: Settings,
    api_client: TestClient,
    api_sessions: sessionmaker[Session],
    api_redis: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Runs ended in a turn that dies before its commit: none is announced nor ended in
    Postgres, and the next process takes them up again (their reports recorded, the runs
    resumed), so none is lost or stuck."""
    own = make_scheduler(api_settings)
    seen = _status_at_announcement(api_sessions, monkeypatch)
    try:
        ids = _one_task_runs_out(own, api_client, api_redis, RUNS)

        def killed(*, commit: bool) -> bool:
            raise Killed

        monkeypatch.setattr(own, "_end_turn", killed)
        with pytest.raises(Killed):
            own.step()
    finally:
        close_scheduler(own)

    assert seen == {}
    with api_sessions() as session:
        statuses = session.execute(
            text("SELECT status::text FROM workflows WHERE id = ANY(:ids)"),
            {"ids": [uuid.UUID(i) for i in ids]},
        ).all()
    assert sorted(row[0] for row in statuses) == ["RUNNING"] * RUNS
    assert api_redis.llen(own.ctx.taken_key) == RUNS

    again = make_scheduler(api_settings, own.id)
    try:
        again.start_up()
        assert sorted(str(i) for i in again.runs) == sorted(ids)
    finally:
        close_scheduler(again)
    assert api_redis.llen(again.ctx.taken_key) == 0


def _statements(scheduler: Scheduler, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The statements the scheduler's store runs from now on (filled in as each returns):
    ``REPORTS`` named, every other one as ``other``."""
    ran: list[str] = []
    run = scheduler.db._run

    def counting(statement: Any, params: dict[str, Any], **kwargs: Any) -> Any:
        rows = run(statement, params, **kwargs)  # the reports held first, if any
        ran.append("REPORTS" if statement is sql.REPORTS else "other")
        return rows

    monkeypatch.setattr(scheduler.db, "_run", counting)
    return ran


def _pushes(scheduler: Scheduler, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The scheduler's pushes onto Redis lists from now on: ``lpush`` for each one alone,
    ``pipeline`` for each pipeline sent (whatever it holds)."""
    pushed: list[str] = []
    client = scheduler.ctx.redis
    lpush, pipeline = client.lpush, client.pipeline

    def one(*args: Any, **kwargs: Any) -> Any:
        pushed.append("lpush")
        return lpush(*args, **kwargs)

    def piped(*args: Any, **kwargs: Any) -> Any:
        pipe = pipeline(*args, **kwargs)
        execute = pipe.execute

        def sent(*a: Any, **k: Any) -> Any:
            pushed.append("pipeline")
            return execute(*a, **k)

        pipe.execute = sent  # type: ignore[method-assign]
        return pipe

    monkeypatch.setattr(client, "lpush", one)
    monkeypatch.setattr(client, "pipeline", piped)
    return pushed


def test_the_reports_a_turn_takes_are_recorded_in_one_statement(
    scheduler: Scheduler,
    api_client: TestClient,
    api_sessions: sessionmaker[Session],
    api_redis: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``RUNS`` reports taken together: their outcomes and the next steps they place are one
    statement, and the next steps' instructions (to ``RUNS`` workers) one Redis round trip,
    not one each a report."""
    reports = _first_tasks_out(scheduler, api_client, api_redis)
    for report in reports:
        api_redis.lpush(scheduler.reply_key, report.dumps())
    scheduler.ctx.tick.at = time.monotonic() + 60  # no tick in this turn
    ran = _statements(scheduler, monkeypatch)
    pushed = _pushes(scheduler, monkeypatch)

    scheduler.step()

    assert ran.count("REPORTS") == 1, ran
    assert pushed == ["pipeline"], pushed
    rows = _task_runs(api_sessions, reports)
    first = {r.task_run_id for r in reports}
    assert sorted(row["status"] for row in rows if row["id"] in first) == ["COMPLETED"] * RUNS
    nexts = {row["id"] for row in rows if row["id"] not in first and row["ref"] == "noop2"}
    assert len(nexts) == RUNS
    queued = {
        Instruction.loads(raw).task_run_id
        for worker in WORKERS
        for raw in api_redis.lrange(keys.worker_queue_key(worker), 0, -1)
    }
    assert nexts <= queued  # every next step recorded was sent


def test_next_steps_redis_did_not_take_are_not_recorded_and_go_again(
    scheduler: Scheduler,
    api_client: TestClient,
    api_sessions: sessionmaker[Session],
    api_redis: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Redis fails the turn's one push of its next steps' instructions: the reports are
    recorded, those steps' task runs are not (nothing went out), and the steps are placed
    again soon."""
    reports = _first_tasks_out(scheduler, api_client, api_redis)
    for report in reports:
        api_redis.lpush(scheduler.reply_key, report.dumps())
    scheduler.ctx.tick.at = time.monotonic() + 60
    client = scheduler.ctx.redis
    pipeline = client.pipeline

    def failing(*args: Any, **kwargs: Any) -> Any:
        pipe = pipeline(*args, **kwargs)

        def fail(*a: Any, **k: Any) -> Any:
            raise redis.ConnectionError("Redis went away")

        pipe.execute = fail  # type: ignore[method-assign]
        return pipe

    monkeypatch.setattr(client, "pipeline", failing)

    scheduler.step()

    rows = _task_runs(api_sessions, reports)
    first = {r.task_run_id for r in reports}
    assert sorted(row["status"] for row in rows if row["id"] in first) == ["COMPLETED"] * RUNS
    assert [row for row in rows if row["id"] not in first] == []
    for report in reports:
        step = scheduler.runs[uuid.UUID(report.workflow_id)].steps["noop2"]
        assert step.in_flight is None and step.retry_at > 0, step


def test_runs_ended_in_one_statement_keep_each_ones_events_in_order(
    scheduler: Scheduler,
    api_client: TestClient,
    api_sessions: sessionmaker[Session],
    api_redis: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every report of the turn ends its run, all in one statement: each run's task event
    comes before its end's, in the order the reports were taken, and every end is told."""
    ids = _one_task_runs_out(scheduler, api_client, api_redis, RUNS)
    scheduler.ctx.tick.at = time.monotonic() + 60
    seen = _status_at_announcement(api_sessions, monkeypatch)
    last_event = _last_event(api_sessions)
    ran = _statements(scheduler, monkeypatch)

    scheduler.step()

    assert ran.count("REPORTS") == 1, ran
    assert seen == dict.fromkeys(ids, "COMPLETED")
    with api_sessions() as session:
        rows = session.execute(
            text(
                "SELECT workflow_id::text, kind FROM events WHERE id > :after "
                "AND kind IN ('task.completed', 'workflow.completed') ORDER BY id"
            ),
            {"after": last_event},
        ).all()
    order = [str(row[0]) for row in rows[::2]]
    assert sorted(order) == sorted(ids)
    assert [(str(r[0]), str(r[1])) for r in rows] == [
        (wid, kind) for wid in order for kind in ("task.completed", "workflow.completed")
    ]


def test_a_statement_of_the_turn_records_the_reports_held_before_it(
    scheduler: Scheduler,
    api_client: TestClient,
    api_sessions: sessionmaker[Session],
    api_redis: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Reports held for the turn's one statement are recorded before any other statement of
    the turn (the turn's writes keep their order), and a turn that is not committed records
    none of them."""
    reports = _first_tasks_out(scheduler, api_client, api_redis)
    db = scheduler.db
    ran = _statements(scheduler, monkeypatch)

    db.begin_turn()
    held = [db.report_later(sql.Reported(r)) for r in reports[:2]]
    assert ran == [] and [h.ended for h in held] == [None, None]
    db.status(uuid.UUID(reports[0].workflow_id))
    assert ran == ["REPORTS", "other"]
    assert [h.ended for h in held] == [False, False]  # recorded; neither ended its run
    db.report_later(sql.Reported(reports[2]))
    assert db.end_turn(commit=False) is False
    assert ran == ["REPORTS", "other"]

    by_id = {row["id"]: row["status"] for row in _task_runs(api_sessions, reports)}
    assert [by_id[r.task_run_id] for r in reports[:3]] == ["QUEUED"] * 3  # rolled back


def test_statements_go_with_postgres_placeholders_converted_once() -> None:
    """The store sends its statements with ``$n`` placeholders, one a name, converted once
    (psycopg keeps its own conversion only for statements up to 4 KiB; ``REPORTS`` is
    longer)."""
    text, names = _native("SELECT %(a)s::int, %(b)s::text WHERE %(a)s::int > 0")
    assert (text, names) == ("SELECT $1::int, $2::text WHERE $1::int > 0", ("a", "b"))
    assert _native("SELECT 'a%%' LIKE %(p)s") == ("SELECT 'a%' LIKE $1", ("p",))
    assert _native(sql.REPORTS) is _native(sql.REPORTS)
    assert "%(" not in _native(sql.REPORTS)[0] and len(sql.REPORTS) > 4096
