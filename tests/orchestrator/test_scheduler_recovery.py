"""The scheduler's loop driven by hand against real Postgres and Redis, with a worker's heartbeat
written by the test, so that orders which are racy in a live system happen every time.

* A worker whose task overruns its timeout reports TIMED_OUT and exits; it is restarted at once.
  If the scheduler's health check sees the restart (a new ``started_at`` in the heartbeat)
  before its loop has read the report, the attempt must still be recorded with its own outcome,
  not as lost to a dead worker.
* A task free to go to any worker waits in the scheduler while no worker has room for it, and
  never goes out once its workflow is cancelled.
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
from orchestrator.contract.wakeups import wake_message
from orchestrator.db.models import (
    Event,
    TaskDefinition,
    TaskRun,
)
from orchestrator.scheduler import dispatch as dispatch_module
from orchestrator.scheduler.dispatch import BEATS_TTL_S
from orchestrator.scheduler.loop import Scheduler
from orchestrator.scheduler.reports import MAX_LOST_ATTEMPTS
from orchestrator.settings import Settings
from tests.orchestrator.scheduler_support import (
    WORKER,
    beat,
    close_scheduler,
    make_scheduler,
    store_definition,
)


def test_a_report_read_after_its_workers_restart_keeps_its_outcome(
    scheduler: Scheduler,
    api_client: TestClient,
    api_sessions: sessionmaker[Session],
    api_redis: redis.Redis,
) -> None:
    beat(api_redis, started_at=1000.0)
    started = api_client.post(
        "/api/workflows", json={"workflow": "noop_pipeline", "input": {"data": {"n": 1}}}
    )
    assert started.status_code == 201, started.text
    workflow_id = started.json()["id"]

    scheduler.claims.claim()  # takes the run and pushes its first task to the only live worker
    raw = api_redis.rpop(keys.worker_queue_key(WORKER))
    assert isinstance(raw, bytes | str), "the first task was not placed on the live worker"
    instruction = Instruction.loads(raw)
    assert instruction.workflow_id == workflow_id

    # The worker overran, reported TIMED_OUT and exited; its restart beats before our loop runs.
    now = time.time()
    report = Report(
        instruction.task_run_id,
        workflow_id,
        WORKER,
        TaskRunStatus.TIMED_OUT,
        now - 1.0,
        now,
        error="task 'noop1' timed out after 1 s",
    )
    api_redis.lpush(scheduler.reply_key, report.dumps())
    beat(api_redis, started_at=2000.0)
    time.sleep(BEATS_TTL_S * 2)  # the scheduler re-reads heartbeats at most this often

    scheduler.recovery.check_in_flight()

    with api_sessions() as session:
        run = session.get(TaskRun, instruction.task_run_id)
        assert run is not None
        assert (run.status, run.error) == (TaskRunStatus.TIMED_OUT, report.error)
        lost = session.scalars(
            select(Event).where(
                Event.workflow_id == uuid.UUID(workflow_id), Event.kind == "task.lost"
            )
        ).all()
    assert lost == [], "the attempt was recorded as lost to a dead worker"
    assert api_redis.llen(scheduler.reply_key) == 0  # the report was read, not left behind


def test_a_task_free_to_go_anywhere_waits_for_room_and_goes_when_a_report_frees_it(
    scheduler: Scheduler,
    api_client: TestClient,
    api_sessions: sessionmaker[Session],
    api_redis: redis.Redis,
) -> None:
    """Late binding (``orchestrator.scheduler.placement``): with one slot and tasks expected to
    take a second, the worker gets its running task plus one queued; a third run waits in the
    scheduler, with no task run recorded, until a report frees the slot."""
    ids = _start_one_task_runs(api_client, api_redis, 3)
    # As if measured: prefetch one task behind the running one.
    scheduler.dispatch.task_s["noop"] = 1.0

    scheduler.claims.claim()
    queue = keys.worker_queue_key(WORKER)
    pushed = [Instruction.loads(raw) for raw in api_redis.lrange(queue, 0, -1)]
    assert sorted(i.workflow_id for i in pushed) == sorted(ids[:2])
    assert [str(w) for w, _ in scheduler.dispatch.waiting] == [ids[2]]
    with api_sessions() as session:
        held = session.scalars(select(TaskRun).where(TaskRun.workflow_id == uuid.UUID(ids[2])))
        assert held.all() == [], "a waiting task must not be recorded as queued at a worker"

    first = Instruction.loads(api_redis.rpop(queue))  # type: ignore[arg-type]
    now = time.time()
    done = Report(
        first.task_run_id, first.workflow_id, WORKER, TaskRunStatus.COMPLETED, now - 0.5, now
    )
    api_redis.lpush(scheduler.reply_key, done.dumps())
    scheduler.step()

    assert not scheduler.dispatch.waiting
    queued = {Instruction.loads(raw).workflow_id for raw in api_redis.lrange(queue, 0, -1)}
    assert queued == {ids[1], ids[2]}
    with api_sessions() as session:
        placed = session.scalars(
            select(TaskRun).where(TaskRun.workflow_id == uuid.UUID(ids[2]))
        ).one()
        assert placed.worker_id == WORKER


def test_a_waiting_task_of_a_cancelled_workflow_never_goes_out(
    scheduler: Scheduler,
    api_client: TestClient,
    api_redis: redis.Redis,
) -> None:
    ids = _start_one_task_runs(api_client, api_redis, 3)
    scheduler.dispatch.task_s["noop"] = 1.0
    scheduler.claims.claim()
    assert [str(w) for w, _ in scheduler.dispatch.waiting] == [ids[2]]

    cancelled = api_client.post(f"/api/workflows/{ids[2]}/cancel")
    assert cancelled.status_code == 200, cancelled.text
    api_redis.delete(keys.WAKE)  # only the cancel's own wake-up below, not the starts'
    api_redis.lpush(keys.WAKE, wake_message(uuid.UUID(ids[2]), cancel=True))
    scheduler.step()
    assert uuid.UUID(ids[2]) not in scheduler.runs

    queue = keys.worker_queue_key(WORKER)
    first = Instruction.loads(api_redis.rpop(queue))  # type: ignore[arg-type]
    now = time.time()
    done = Report(
        first.task_run_id, first.workflow_id, WORKER, TaskRunStatus.COMPLETED, now - 0.5, now
    )
    api_redis.lpush(scheduler.reply_key, done.dumps())
    scheduler.step()  # a slot is free, but the only waiting run was cancelled

    queued = [Instruction.loads(raw).workflow_id for raw in api_redis.lrange(queue, 0, -1)]
    assert queued == [ids[1]] and not scheduler.dispatch.waiting
    assert api_client.get(f"/api/workflows/{ids[2]}").json()["status"] == "CANCELLED"


def _start_one_task_runs(api_client: TestClient, api_redis: redis.Redis, count: int) -> list[str]:
    """A live one-slot worker with an empty queue, and ``count`` started workflows of one no-op
    task each under ``transfer`` (every task free to go anywhere); their ids, oldest first."""
    beat(api_redis, started_at=1000.0)
    api_redis.delete(keys.worker_queue_key(WORKER))  # what earlier tests left for this worker
    name = f"one_noop_{uuid.uuid4().hex[:8]}"
    registered = api_client.post(
        "/api/workflow-definitions", json={"name": name, "tasks": [{"ref": "n", "task": "noop"}]}
    )
    assert registered.status_code == 201, registered.text
    body = {"workflow": name, "input": {"data": {}}, "policy": "transfer"}
    return [api_client.post("/api/workflows", json=body).json()["id"] for _ in range(count)]


def test_a_cdi_workflows_first_task_goes_out_naming_its_s3_input_and_no_object_is_made(
    scheduler: Scheduler, api_client: TestClient, api_redis: redis.Redis
) -> None:
    """The scheduler touches no image: the first task's worker makes the object from the
    input. Any CDI call would fail this test (``NoCDI``)."""
    beat(api_redis, started_at=1000.0)
    api_redis.delete(keys.worker_queue_key(WORKER))
    image = "s3://cdiflow/images/any.jpg"
    body = {"workflow": "image_pipeline", "input": {"image": image}, "policy": "affinity"}
    started = api_client.post("/api/workflows", json=body)
    assert started.status_code == 201, started.text
    workflow_id = started.json()["id"]

    scheduler.claims.claim()
    raw = api_redis.rpop(keys.worker_queue_key(WORKER))
    assert isinstance(raw, bytes | str), "the first task was not pushed to the only live worker"
    first = Instruction.loads(raw)
    assert (first.workflow_id, first.data_plane, first.input_uri) == (workflow_id, "cdi", image)
    assert first.key and first.output_key and first.key != first.output_key
    assert first.return_to == scheduler.id  # the object's recovery container
    assert first.keep and not first.held and not first.output_uri
    run = scheduler.runs[uuid.UUID(workflow_id)]
    assert run.objects == {}  # no object until the worker reports one


def test_the_loop_goes_on_after_redis_drops_its_connection(
    scheduler: Scheduler,
    api_client: TestClient,
    api_redis: redis.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The loop's client keeps one connection; when Redis drops it (a restart, a failover) the
    next read fails, and the loop waits a moment and goes on instead of stopping."""
    beat(api_redis, started_at=1000.0)
    assert scheduler.redis.ping()
    assert api_redis.client_kill_filter(_id=str(scheduler.redis.client_id())) == 1
    with caplog.at_level("WARNING", logger="orchestrator.scheduler.loop"):
        scheduler.step()  # the read on the dropped connection
    assert "Redis failed the loop's read" in caplog.text

    started = api_client.post(
        "/api/workflows", json={"workflow": "noop_pipeline", "input": {"data": {"n": 1}}}
    )
    assert started.status_code == 201, started.text
    queue = keys.worker_queue_key(WORKER)
    deadline = time.monotonic() + 10
    while api_redis.llen(queue) == 0 and time.monotonic() < deadline:
        scheduler.step()  # reconnects, reads the wake-up, claims and places the first task
    raw = api_redis.rpop(queue)
    assert isinstance(raw, bytes | str), "the new run's first task was never placed"
    assert Instruction.loads(raw).workflow_id == started.json()["id"]


def _report_done(scheduler: Scheduler, api_redis: redis.Redis, ins: Instruction) -> None:
    now = time.time()
    report = Report(ins.task_run_id, ins.workflow_id, WORKER, TaskRunStatus.COMPLETED, now, now)
    api_redis.lpush(scheduler.reply_key, report.dumps())
    scheduler.step()


def test_a_forks_branches_go_out_together_and_its_join_waits_for_both(
    scheduler: Scheduler,
    api_client: TestClient,
    api_sessions: sessionmaker[Session],
    api_redis: redis.Redis,
) -> None:
    beat(api_redis, started_at=1000.0)
    queue = keys.worker_queue_key(WORKER)
    api_redis.delete(queue)
    name = store_definition(api_sessions, [
        {"ref": "a", "task": "noop"},
        {"ref": "b1", "task": "noop", "depends_on": ["a"]},
        {"ref": "b2", "task": "noop", "depends_on": ["a"]},
        {"ref": "c", "task": "noop", "depends_on": ["b1", "b2"], "inputs": {}},
    ])  # fmt: skip
    started = api_client.post("/api/workflows", json={"workflow": name, "input": {"data": {}}})
    assert started.status_code == 201, started.text
    scheduler.claims.claim()

    def popped() -> list[Instruction]:
        raws = [str(raw) for raw in reversed(api_redis.lrange(queue, 0, -1))]
        return [Instruction.loads(raw) for raw in raws if api_redis.lrem(queue, 1, raw)]

    [a] = popped()
    _report_done(scheduler, api_redis, a)
    branches = popped()
    assert sorted(i.ref for i in branches) == ["b1", "b2"]  # both at once
    _report_done(scheduler, api_redis, branches[0])
    assert popped() == []  # the join waits for the other branch
    _report_done(scheduler, api_redis, branches[1])
    [c] = popped()
    assert c.ref == "c" and c.inputs == {} and not c.chain
    _report_done(scheduler, api_redis, c)
    detail = api_client.get(f"/api/workflows/{started.json()['id']}").json()
    assert detail["status"] == "COMPLETED", detail["error"]
    assert sorted(r["ref"] for r in detail["task_runs"]) == ["a", "b1", "b2", "c"]


def test_a_fan_out_goes_out_no_more_than_the_runs_parallelism_at_once(
    scheduler: Scheduler,
    api_client: TestClient,
    api_sessions: sessionmaker[Session],
    api_redis: redis.Redis,
) -> None:
    """Five elements, at most two out at once: each report lets the next one go; the join
    gets every element's output, in order."""
    beat(api_redis, started_at=1000.0)
    queue = keys.worker_queue_key(WORKER)
    api_redis.delete(queue)
    name = store_definition(api_sessions, [
        {"ref": "split", "task": "noop"},
        {"ref": "each", "task": "noop", "inputs": {"x": "split.items"}, "for_each": "x"},
        {"ref": "join", "task": "noop", "inputs": {"all": "each.n"}},
    ])  # fmt: skip
    started = api_client.post("/api/workflows", json={"workflow": name, "input": {"data": {}}})
    assert started.status_code == 201, started.text
    scheduler.claims.claim()
    run = scheduler.runs[uuid.UUID(started.json()["id"])]
    run.max_parallel = 2

    def popped() -> list[Instruction]:
        raws = [str(raw) for raw in reversed(api_redis.lrange(queue, 0, -1))]
        return [Instruction.loads(raw) for raw in raws if api_redis.lrem(queue, 1, raw)]

    def report(ins: Instruction, output: dict[str, Any]) -> None:
        now = time.time()
        done = Report(ins.task_run_id, ins.workflow_id, WORKER, TaskRunStatus.COMPLETED, now,
                      now, output=output)  # fmt: skip
        api_redis.lpush(scheduler.reply_key, done.dumps())
        scheduler.step()

    [split] = popped()
    report(split, {"items": [10, 20, 30, 40, 50]})
    out = popped()
    assert [i.ref for i in out] == ["each[0]", "each[1]"]
    assert [i.inputs["x"] for i in out] == [{"value": 10}, {"value": 20}]
    sent, join = [i.ref for i in out], None
    while out:
        ins = out.pop(0)
        report(ins, {"n": ins.inputs["x"]["value"] + 1})
        for new in popped():
            if new.ref == "join":
                join = new
            else:
                out.append(new)
                sent.append(new.ref)
        assert len(out) <= 2, [i.ref for i in out]  # never more than two out
    assert sent == [f"each[{i}]" for i in range(5)]
    assert join is not None
    assert join.inputs["all"] == {"items": [{"value": n} for n in (11, 21, 31, 41, 51)]}


def test_a_stored_definition_that_cannot_run_fails_its_run_with_the_reason(
    scheduler: Scheduler,
    api_client: TestClient,
    api_sessions: sessionmaker[Session],
    api_redis: redis.Redis,
) -> None:
    """A sub-workflow deleted since its definition was stored: the scheduler fails the run,
    saying why, and runs nothing."""
    beat(api_redis, started_at=1000.0)
    name = store_definition(api_sessions, [
        {"ref": "a", "task": "noop"},
        {"ref": "sub", "workflow": "deleted_long_ago", "depends_on": ["a"]},
    ])  # fmt: skip
    started = api_client.post("/api/workflows", json={"workflow": name, "input": {"data": {}}})
    assert started.status_code == 201, started.text
    scheduler.claims.claim()
    detail = api_client.get(f"/api/workflows/{started.json()['id']}").json()
    assert detail["status"] == "FAILED"
    assert "cannot run" in detail["error"] and "'deleted_long_ago' is gone" in detail["error"]
    assert detail["task_runs"] == []  # nothing ran


def test_a_run_keeps_the_definition_version_it_was_started_with(
    scheduler: Scheduler, api_client: TestClient, api_redis: redis.Redis
) -> None:
    """A new version saved while a run waits does not change what that run executes."""
    beat(api_redis, started_at=1000.0)
    name = f"versioned_{uuid.uuid4().hex[:8]}"
    first = {"tasks": [{"ref": "one", "task": "noop"}]}
    assert api_client.put(f"/api/workflow-definitions/{name}", json=first).status_code == 201
    old = api_client.post("/api/workflows", json={"workflow": name, "input": {"data": {}}})
    second = {"tasks": [{"ref": "first", "task": "noop"}, {"ref": "then", "task": "noop",
                                                           "depends_on": ["first"]}]}  # fmt: skip
    saved = api_client.put(f"/api/workflow-definitions/{name}", json=second)
    assert saved.status_code == 200 and saved.json()["version"] == 2, saved.text
    new = api_client.post("/api/workflows", json={"workflow": name, "input": {"data": {}}})
    assert (old.json()["workflow_version"], new.json()["workflow_version"]) == (1, 2)

    scheduler.claims.claim()
    queue = keys.worker_queue_key(WORKER)
    placed = {}
    while isinstance(raw := api_redis.rpop(queue), bytes | str):
        instruction = Instruction.loads(raw)
        placed[instruction.workflow_id] = instruction.ref
    assert placed == {old.json()["id"]: "one", new.json()["id"]: "first"}


def test_a_step_no_live_worker_loaded_waits_then_fails_its_run(
    scheduler: Scheduler,
    api_client: TestClient,
    api_sessions: sessionmaker[Session],
    api_redis: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The only live worker loaded the bundled tasks alone: a step of another module is
    never sent to it, and its run fails, saying why, once the grace has passed."""
    beat(api_redis, started_at=1000.0)
    task, flow = f"gone_{uuid.uuid4().hex[:8]}", f"unrunnable_{uuid.uuid4().hex[:8]}"
    with api_sessions() as session, session.begin():  # registered while such a worker lived
        session.add(TaskDefinition(name=task, module="retired_tasks:fn", timeout_s=5, retries=0,
                                   retry_backoff_s=0.5))  # fmt: skip
    steps = [{"ref": "first", "task": "noop"}, {"ref": "then", "task": task,
                                                "depends_on": ["first"]}]  # fmt: skip
    assert api_client.put(f"/api/workflow-definitions/{flow}", json={"tasks": steps}).is_success
    started = api_client.post("/api/workflows", json={"workflow": flow, "input": {"data": {}}})
    run_id = started.json()["id"]
    queue = keys.worker_queue_key(WORKER)

    scheduler.claims.claim()  # the first step (bundled) goes to the worker
    raw = api_redis.rpop(queue)
    assert isinstance(raw, bytes | str)
    first = Instruction.loads(raw)
    now = time.time()
    done = Report(first.task_run_id, run_id, WORKER, TaskRunStatus.COMPLETED, now - 0.01, now)
    api_redis.lpush(scheduler.reply_key, done.dumps())
    scheduler.step()  # reads the report; the next step has nowhere to go, so it waits
    assert api_redis.llen(queue) == 0
    assert api_client.get(f"/api/workflows/{run_id}").json()["status"] == "RUNNING"

    assert [str(w) for w, _ in scheduler.dispatch.waiting] == [run_id]
    monkeypatch.setattr(dispatch_module, "UNRUNNABLE_AFTER_S", 0.0)
    time.sleep(0.01)
    scheduler._tick()  # the housekeeping that fails a run no worker can take
    detail = api_client.get(f"/api/workflows/{run_id}").json()
    assert detail["status"] == "FAILED" and api_redis.llen(queue) == 0
    assert "no live worker has loaded module 'retired_tasks'" in detail["error"]
    assert f"task {task!r} (step 'then')" in detail["error"]


class _RestartedMinion:
    """A minion link that reports no restart when asked: the object's loss is known only from
    the worker's report. Any other call is a bug in the premise (the run holds no object)."""

    host = "test"

    def __init__(self) -> None:
        self.checks = 0

    def check(self) -> bool:
        self.checks += 1
        return False

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"unexpected cdi.{name} call")


def test_an_object_gone_from_the_minion_drives_the_run_again_without_spending_an_attempt(
    api_settings: Settings, api_client: TestClient, api_redis: redis.Redis
) -> None:
    """A worker finds the object it was handed gone (its minion restarted before the
    scheduler's tick noticed): the run goes again from its input, though its step has no
    retries, and the scheduler asks the minion whether it restarted."""
    minion = _RestartedMinion()
    own = make_scheduler(api_settings, cdi=minion)
    try:
        beat(api_redis, started_at=1000.0)
        queue = keys.worker_queue_key(WORKER)
        api_redis.delete(queue)
        body = {"workflow": "image_pipeline", "input": {"image": "s3://cdiflow/images/any.jpg"}}
        started = api_client.post("/api/workflows", json=body)
        assert started.status_code == 201, started.text
        workflow_id = started.json()["id"]
        own.claims.claim()
        raw = api_redis.rpop(queue)
        assert isinstance(raw, bytes | str), "the first task was not pushed to the live worker"
        first = Instruction.loads(raw)

        now = time.time()
        gone = Report(
            first.task_run_id,
            workflow_id,
            WORKER,
            TaskRunStatus.FAILED,
            now,
            now,
            error=f"CDI object {first.key!r} does not exist",
            objects_gone=True,
        )
        api_redis.lpush(own.reply_key, gone.dumps())
        deadline = time.monotonic() + 10.0
        again: Instruction | None = None
        while again is None and time.monotonic() < deadline:
            own.step()  # reads the report, then (after the redrive's backoff) places again
            raw = api_redis.rpop(queue)
            again = Instruction.loads(raw) if isinstance(raw, bytes | str) else None
        assert again is not None, "the run was not driven again"
        assert (again.workflow_id, again.ref) == (workflow_id, first.ref)
        assert again.task_run_id != first.task_run_id
        detail = api_client.get(f"/api/workflows/{workflow_id}").json()
        assert detail["status"] == "RUNNING", detail["error"]
        assert minion.checks >= 1, "the scheduler did not ask whether the minion restarted"
    finally:
        close_scheduler(own)


def test_a_task_lost_with_its_worker_runs_again_though_its_step_has_no_retries(
    scheduler: Scheduler, api_client: TestClient, api_redis: redis.Redis
) -> None:
    """A step's ``retries`` count the task's own failures: an attempt lost with its worker
    (here: the worker restarts with the task unreported) goes out again, up to
    ``MAX_LOST_ATTEMPTS`` times, and the next loss fails the run, saying why."""
    beat(api_redis, started_at=1000.0)
    queue = keys.worker_queue_key(WORKER)
    api_redis.delete(queue)
    started = api_client.post(
        "/api/workflows", json={"workflow": "noop_pipeline", "input": {"data": {"n": 1}}}
    )
    assert started.status_code == 201, started.text
    workflow_id = started.json()["id"]
    scheduler.claims.claim()
    raw = api_redis.rpop(queue)
    assert isinstance(raw, bytes | str), "the first task was not pushed to the live worker"
    sent = [Instruction.loads(raw)]  # noop1, whose task has retries=0

    for restart in range(1, MAX_LOST_ATTEMPTS + 2):
        beat(api_redis, started_at=1000.0 + restart)  # it restarted: the task died with it
        time.sleep(BEATS_TTL_S * 2)  # the scheduler re-reads heartbeats at most this often
        scheduler.recovery.check_in_flight()
        if restart > MAX_LOST_ATTEMPTS:
            break
        again: Instruction | None = None
        deadline = time.monotonic() + 10.0
        while again is None and time.monotonic() < deadline:
            scheduler.step()  # the retry goes out after the step's backoff
            raw = api_redis.rpop(queue)
            again = Instruction.loads(raw) if isinstance(raw, bytes | str) else None
        assert again is not None, f"loss {restart}: the task did not go out again"
        assert again.ref == sent[0].ref and again.task_run_id != sent[-1].task_run_id
        sent.append(again)
        status = api_client.get(f"/api/workflows/{workflow_id}").json()["status"]
        assert status == "RUNNING", f"loss {restart} ended the run: {status}"

    detail = api_client.get(f"/api/workflows/{workflow_id}").json()
    assert detail["status"] == "FAILED"
    assert "died" in detail["error"] or "restarted" in detail["error"], detail["error"]
    assert len(sent) == MAX_LOST_ATTEMPTS + 1
