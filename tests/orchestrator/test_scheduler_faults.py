"""The scheduler when its parts fail, driven by hand against real Postgres and Redis: no failure
leaves a workflow RUNNING with nothing under way.

* A restarted scheduler resumes its RUNNING workflows with every step's attempts going on from
  what Postgres has (it used to place step 1 as attempt 1 again and die on the unique key).
* A step that raises while being placed (Redis away) leaves the run for the tick's sweep; an
  instruction Redis did not take is placed again, and its run driven again from its input if
  objects had already gone to that worker.
* Postgres failing a write makes the scheduler resume from what Postgres has once it answers.
* A dead scheduler's workflows are taken over by the lease holder and driven again, attempts
  going on; a live scheduler's are never touched.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from orchestrator.contract import keys
from orchestrator.contract.messages import Instruction, Report
from orchestrator.contract.vocabulary import TaskRunStatus
from orchestrator.db.models import Event, TaskRun
from orchestrator.db.scheduler_liveness import LIVENESS_CLASS, alive_schedulers_sql
from orchestrator.errors import ServiceError
from orchestrator.scheduler.guarded import guarded
from orchestrator.scheduler.loop import Scheduler
from orchestrator.settings import Settings
from tests.orchestrator.scheduler_support import (
    WORKER,
    MinionHands,
    beat,
    close_scheduler,
    make_scheduler,
)


def _start(api_client: TestClient, api_redis: redis.Redis, n: int = 1) -> list[str]:
    """A live worker with an empty queue and ``n`` started no-op workflows (dataless)."""
    beat(api_redis, started_at=1000.0)
    api_redis.delete(keys.worker_queue_key(WORKER))
    api_redis.delete(keys.WAKE)
    body = {"workflow": "noop_pipeline", "input": {"data": {"n": 1}}}
    ids = []
    for _ in range(n):
        started = api_client.post("/api/workflows", json=body)
        assert started.status_code == 201, started.text
        ids.append(started.json()["id"])
    return ids


def _queued(api_redis: redis.Redis) -> list[Instruction]:
    queue = keys.worker_queue_key(WORKER)
    return [Instruction.loads(raw) for raw in api_redis.lrange(queue, 0, -1)]


def _task_runs(sessions: sessionmaker[Session], workflow_id: str) -> list[tuple[str, int, str]]:
    with sessions() as session:
        rows = session.scalars(
            select(TaskRun)
            .where(TaskRun.workflow_id == uuid.UUID(workflow_id))
            .order_by(TaskRun.id)
        ).all()
        return [(r.ref, r.attempt, str(r.status)) for r in rows]


def test_a_restarted_scheduler_resumes_with_the_next_attempt_not_a_colliding_one(
    api_settings: Settings,
    api_client: TestClient,
    api_sessions: sessionmaker[Session],
    api_redis: redis.Redis,
) -> None:
    (workflow_id,) = _start(api_client, api_redis)
    name = f"scheduler-{uuid.uuid4().hex[:8]}"
    first = make_scheduler(api_settings, name)
    try:
        first.claims.claim()  # step 1, attempt 1 goes out and is recorded QUEUED
    finally:
        close_scheduler(first)  # then the process dies (kill -9 sends no goodbye)
    assert _task_runs(api_sessions, workflow_id) == [("noop1", 1, "QUEUED")]

    second = make_scheduler(api_settings, name)  # the same id: the stack restarts it
    try:
        second.start_up()
        runs = _task_runs(api_sessions, workflow_id)
        assert runs[0][:2] == ("noop1", 1) and runs[0][2] == "FAILED"
        assert runs[1] == ("noop1", 2, "QUEUED")
        latest = _queued(api_redis)[0]  # LPUSH: the newest is first
        assert (latest.workflow_id, latest.ref, latest.attempt) == (workflow_id, "noop1", 2)
        second.start_up()  # run again in the same process: nothing is resumed twice
        assert _task_runs(api_sessions, workflow_id)[-1] == ("noop1", 2, "QUEUED")
    finally:
        close_scheduler(second)


def test_a_step_that_raises_while_placing_is_placed_again_by_the_sweep(
    scheduler: Scheduler,
    api_client: TestClient,
    api_redis: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (workflow_id,) = _start(api_client, api_redis)
    real = scheduler.dispatch.loads

    def redis_away() -> list[Any]:
        raise redis.ConnectionError("Redis is restarting")

    monkeypatch.setattr(scheduler.dispatch, "loads", redis_away)
    guarded(scheduler.claims.claim, scheduler.ctx.faults)  # claimed, but nothing placed
    assert uuid.UUID(workflow_id) in scheduler.runs and _queued(api_redis) == []

    monkeypatch.setattr(scheduler.dispatch, "loads", real)
    scheduler._tick()
    assert [i.workflow_id for i in _queued(api_redis)] == [workflow_id]


def test_an_instruction_redis_did_not_take_is_placed_again(
    scheduler: Scheduler,
    api_client: TestClient,
    api_redis: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (workflow_id,) = _start(api_client, api_redis)
    real = scheduler.redis.lpush
    failures = [redis.ConnectionError("connection reset")]

    def flaky_lpush(key: str, *values: Any) -> Any:
        if failures and key == keys.worker_queue_key(WORKER):
            raise failures.pop()
        return real(key, *values)

    monkeypatch.setattr(scheduler.redis, "lpush", flaky_lpush)
    scheduler.claims.claim()
    step = scheduler.runs[uuid.UUID(workflow_id)].steps["noop1"]
    assert step.in_flight is None and step.retry_at > 0  # nothing out, a retry due
    assert scheduler.dispatch._in_flight[WORKER] == 0
    step.retry_at = 1e-9  # due now
    scheduler._tick()
    assert [i.workflow_id for i in _queued(api_redis)] == [workflow_id]


def test_an_instruction_redis_did_not_take_after_a_move_drives_the_run_again(
    api_settings: Settings,
    api_client: TestClient,
    api_redis: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    api_redis.delete(keys.worker_queue_key(WORKER))
    beat(api_redis, started_at=1000.0)
    own = make_scheduler(api_settings, cdi=MinionHands())
    try:
        body = {"workflow": "image_pipeline", "input": {"image": "s3://cdiflow/images/a.jpg"},
                "policy": "transfer"}  # fmt: skip
        started = api_client.post("/api/workflows", json=body)
        assert started.status_code == 201, started.text
        workflow_id = started.json()["id"]
        own.claims.claim()
        (first,) = _queued(api_redis)
        api_redis.delete(keys.worker_queue_key(WORKER))
        # Its image comes back to the scheduler, which hands it to the next step's worker.
        now = time.time()
        done = Report(first.task_run_id, workflow_id, WORKER, TaskRunStatus.COMPLETED,
                      now - 0.1, now, key=first.output_key, bytes_out=1_000)  # fmt: skip
        real, failures = own.redis.lpush, [redis.ConnectionError("connection reset")]
        pipeline = own.redis.pipeline
        queue = keys.worker_queue_key(WORKER)

        def flaky_lpush(key: str, *values: Any) -> Any:
            if failures and key == queue:
                raise failures.pop()
            return real(key, *values)

        def flaky_pipeline(*args: Any, **kwargs: Any) -> Any:  # a turn's instructions, together
            pipe = pipeline(*args, **kwargs)
            execute = pipe.execute

            def flaky_execute(*a: Any, **k: Any) -> Any:
                if failures and any(queue in c[0] for c in pipe.command_stack):
                    raise failures.pop()
                return execute(*a, **k)

            pipe.execute = flaky_execute  # type: ignore[method-assign]
            return pipe

        monkeypatch.setattr(own.redis, "lpush", flaky_lpush)
        monkeypatch.setattr(own.redis, "pipeline", flaky_pipeline)
        api_redis.lpush(own.reply_key, done.dumps())
        own.step()  # the image went to the worker, its instruction did not: drive it again
        run = own.runs[uuid.UUID(workflow_id)]
        assert run.drives == 2 and not failures
        assert [s.id for s in run.steps.values() if s.retry_at] == ["deblur"]  # after a pause
        # The worker is asked to give back what it was handed for the lost instruction.
        (release,) = _queued(api_redis)
        assert release.ref == "release" and release.inputs["owned0"]["key"] == first.output_key
    finally:
        close_scheduler(own)


def test_postgres_failing_a_write_makes_the_scheduler_resume_from_what_it_has(
    scheduler: Scheduler,
    api_client: TestClient,
    api_sessions: sessionmaker[Session],
    api_redis: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (workflow_id,) = _start(api_client, api_redis)
    scheduler.claims.claim()
    first = _queued(api_redis)[0]
    real = scheduler.db.report

    def postgres_gone(*args: Any, **kwargs: Any) -> bool:
        raise ServiceError("Postgres failed the scheduler's write: gone", service="postgres")

    monkeypatch.setattr(scheduler.db, "report", postgres_gone)
    done = Report(first.task_run_id, workflow_id, WORKER, TaskRunStatus.COMPLETED, 1.0, 2.0)
    scheduler.reports.read(done.dumps())
    assert scheduler.ctx.faults.postgres

    monkeypatch.setattr(scheduler.db, "report", real)
    scheduler._tick()  # Postgres answers again: resync
    assert not scheduler.ctx.faults.postgres
    runs = _task_runs(api_sessions, workflow_id)
    assert runs[0] == ("noop1", 1, "FAILED")  # the report was never recorded: done again
    assert runs[-1] == ("noop1", 2, "QUEUED")
    with api_sessions() as session:
        kinds = session.scalars(
            select(Event.kind).where(Event.workflow_id == uuid.UUID(workflow_id))
        ).all()
    assert "workflow.resumed" in kinds


def test_postgres_failing_the_claim_of_a_wake_up_does_not_end_the_loop(
    scheduler: Scheduler,
    api_client: TestClient,
    api_redis: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A new run's wake-up makes the loop claim it; Postgres failing that write (its disk
    full, say) is noted, and the run is claimed once Postgres answers."""
    (workflow_id,) = _start(api_client, api_redis)  # its wake-up waits on keys.WAKE
    real = scheduler.db.claim

    def disk_full(*args: Any, **kwargs: Any) -> list[Any]:
        raise ServiceError("Postgres cannot write: the disk of its data folder is full",
                           service="postgres")  # fmt: skip

    monkeypatch.setattr(scheduler.db, "claim", disk_full)
    scheduler.step()  # takes the wake-up: the claim fails, the loop goes on
    assert scheduler.ctx.faults.postgres
    assert not api_redis.llen(keys.WAKE)
    monkeypatch.setattr(scheduler.db, "claim", real)
    scheduler._tick()  # Postgres answers again: resync, then the claim
    assert [i.workflow_id for i in _queued(api_redis)] == [workflow_id]


def test_a_dead_schedulers_workflows_go_to_a_live_one_and_a_live_ones_stay(
    api_settings: Settings,
    api_client: TestClient,
    api_sessions: sessionmaker[Session],
    api_redis: redis.Redis,
) -> None:
    alive = make_scheduler(api_settings, reconciled=True)
    dying = make_scheduler(api_settings, reconciled=True)
    survivor = make_scheduler(api_settings, reconciled=True)
    try:
        for each in (alive, dying, survivor):
            each.start_up()  # takes its liveness lock
        (kept,) = _start(api_client, api_redis)
        alive.claims.claim()
        (orphan,) = _start(api_client, api_redis)
        dying.claims.claim()
        assert uuid.UUID(orphan) in dying.runs and uuid.UUID(kept) in alive.runs
        close_scheduler(dying)  # its connections close: its lock is gone
        _until_its_lock_is_gone(api_sessions, dying.id)

        # Whoever holds the lease takes it over, once: as soon as Postgres has seen the dead
        # one's connection close (its backend ends a moment after the client).
        deadline = time.monotonic() + 10
        holders: list[Scheduler] = []
        while not holders and time.monotonic() < deadline:
            for each in (alive, survivor):
                each._reconcile()
            holders = [each for each in (alive, survivor) if uuid.UUID(orphan) in each.runs]
            time.sleep(0.1)
        assert len(holders) == 1, "the dead scheduler's workflow was taken over once"
        step = holders[0].runs[uuid.UUID(orphan)].steps["noop1"]
        assert step.attempt == 2  # placed or waiting for room
        assert uuid.UUID(kept) in alive.runs and uuid.UUID(kept) not in survivor.runs
        attempts = sorted((a, status) for _, a, status in _task_runs(api_sessions, orphan))
        assert attempts[0] == (1, "FAILED") and attempts[1:] in ([], [(2, "QUEUED")])
    finally:
        close_scheduler(alive)
        close_scheduler(survivor)


def _until_its_lock_is_gone(sessions: sessionmaker[Session], scheduler_id: str) -> None:
    """Postgres drops a closed connection's locks once its backend has seen the close, a moment
    after the client closed it: wait for that, as a dead process's lock is gone by then."""
    held = "SELECT " + alive_schedulers_sql("%(who)s")
    deadline = time.monotonic() + 10
    while True:
        with sessions() as session:
            params = {"who": scheduler_id, "cls": LIVENESS_CLASS}
            if not session.connection().exec_driver_sql(held, params).scalar():
                return
        assert time.monotonic() < deadline, f"{scheduler_id}'s liveness lock stayed held"
        time.sleep(0.02)
