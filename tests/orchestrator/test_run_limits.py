"""A run's limits and what it waits for, with the scheduler driven by hand against real
Postgres and Redis and a worker's heartbeat written by the test:

* a time limit, the definition's or the start's: past it the run ends TIMED_OUT naming the
  step it was in, and the worker running that step is told to stop it;
* a cancelled run's running task is stopped on its worker;
* a run whose next step no live worker can run says so (its status detail and events), and
  ``/api/readyz`` says there is no live worker; a definition's ``worker_wait_s`` bounds that
  wait;
* a worker that starts afresh to stop a task gets nothing more until its new process beats.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import redis
from fastapi.testclient import TestClient

from orchestrator.contract import keys
from orchestrator.contract.messages import Instruction, Report, Stop
from orchestrator.contract.vocabulary import TaskRunStatus
from orchestrator.scheduler.loop import Scheduler
from tests.orchestrator.scheduler_support import WORKER, beat


def _define(client: TestClient, steps: list[dict[str, Any]], **limits: Any) -> str:
    name = f"limits_{uuid.uuid4().hex[:8]}"
    reply = client.post("/api/workflow-definitions", json={"name": name, "tasks": steps, **limits})
    assert reply.status_code == 201, reply.text
    return name


def _start(client: TestClient, workflow: str, **extra: Any) -> dict[str, Any]:
    reply = client.post("/api/workflows", json={"workflow": workflow, "input": {}, **extra})
    assert reply.status_code == 201, reply.text
    body: dict[str, Any] = reply.json()
    return body


def _detail(client: TestClient, run_id: str) -> dict[str, Any]:
    body: dict[str, Any] = client.get(f"/api/workflows/{run_id}").json()
    return body


def _queued(api_redis: redis.Redis, run_id: str) -> list[Instruction]:
    """The instructions of run ``run_id`` the test's worker was sent, taken off its queue (the
    worker 'pops' them)."""
    queue = keys.worker_queue_key(WORKER)
    taken = []
    while (raw := api_redis.rpop(queue)) is not None:
        taken.append(Instruction.loads(raw))  # type: ignore[arg-type]
    return [i for i in taken if i.workflow_id == run_id]


def _stops(api_redis: redis.Redis) -> list[Stop]:
    control = keys.worker_control_key(WORKER)
    stops = []
    while (raw := api_redis.rpop(control)) is not None:
        stops.append(Stop.loads(raw))  # type: ignore[arg-type]
    return stops


def _fresh_worker(api_redis: redis.Redis, started_at: float = 1000.0) -> None:
    for key in (keys.worker_queue_key(WORKER), keys.worker_control_key(WORKER)):
        api_redis.delete(key)
    beat(api_redis, started_at=started_at)


def _cancel(scheduler: Scheduler, client: TestClient, run_id: str) -> None:
    """Cancel the run, and let the scheduler act on the cancellation's wake-up."""
    scheduler.redis.delete(keys.WAKE)  # the starts' wake-ups, which earlier claims served
    assert client.post(f"/api/workflows/{run_id}/cancel").status_code == 200
    scheduler.step()


def _report(scheduler: Scheduler, ins: Instruction, status: TaskRunStatus, **fields: Any) -> None:
    now = time.time()
    report = Report(ins.task_run_id, ins.workflow_id, WORKER, status, now - 0.1, now, **fields)
    scheduler.redis.lpush(scheduler.reply_key, report.dumps())
    scheduler.step()


# --- time limits ---------------------------------------------------------------------------


def test_a_run_gets_its_definitions_time_limit_unless_its_start_sets_one(
    api_client: TestClient,
) -> None:
    flow = _define(api_client, [{"ref": "a", "task": "noop"}], timeout_s=30, worker_wait_s=5)
    shown = api_client.get(f"/api/workflow-definitions/{flow}").json()
    assert (shown["timeout_s"], shown["worker_wait_s"]) == (30, 5)
    assert _start(api_client, flow)["timeout_s"] == 30
    assert _start(api_client, flow, timeout_s=2.5)["timeout_s"] == 2.5
    plain = _define(api_client, [{"ref": "a", "task": "noop"}])
    assert _start(api_client, plain)["timeout_s"] is None
    # A new version with other limits is a new version; the same limits save nothing.
    steps = {"tasks": [{"ref": "a", "task": "noop"}]}
    path = f"/api/workflow-definitions/{flow}"
    again = api_client.put(path, json={**steps, "timeout_s": 30, "worker_wait_s": 5})
    assert again.json()["version"] == 1
    longer = api_client.put(path, json={**steps, "timeout_s": 60})
    assert (longer.json()["version"], longer.json()["timeout_s"]) == (2, 60)
    assert _start(api_client, flow, version=1)["timeout_s"] == 30  # that version's limit
    assert _start(api_client, flow)["timeout_s"] == 60
    for bad in (0, -1, "soon", 10**9):
        refused = api_client.post("/api/workflows", json={"workflow": flow, "input": {},
                                                          "timeout_s": bad})  # fmt: skip
        assert refused.status_code == 422, refused.text
        refused = api_client.put(path, json={**steps, "worker_wait_s": bad})
        assert refused.status_code == 422, refused.text
    for run in api_client.get("/api/workflows", params={"status": "PENDING"}).json()["items"]:
        api_client.post(f"/api/workflows/{run['id']}/cancel")  # no scheduler is to take them


def test_a_run_past_its_time_limit_ends_timed_out_naming_the_step_and_the_task_is_stopped(
    scheduler: Scheduler, api_client: TestClient, api_redis: redis.Redis
) -> None:
    _fresh_worker(api_redis)
    nap = {"ref": "nap", "task": "sleep", "params": {"ms": 60_000}}
    flow = _define(api_client, [nap, {"ref": "after", "task": "noop", "depends_on": ["nap"]}])
    run_id = _start(api_client, flow, timeout_s=0.5)["id"]
    scheduler.claims.claim()
    [sent] = _queued(api_redis, run_id)
    assert sent.ref == "nap"
    while _detail(api_client, run_id)["status"] == "RUNNING":
        scheduler.step()  # the tick comes at the deadline
    done = _detail(api_client, run_id)
    assert done["status"] == "TIMED_OUT", done
    assert done["error"] == (
        f"the run passed its time limit of 0.5 s in step 'nap' (attempt 1, on {WORKER})"
    )
    [ended] = [e for e in done["events"] if e["kind"] == "workflow.timed_out"]
    assert (ended["data"]["steps"], ended["data"]["to"]) == (["nap"], "TIMED_OUT")
    [stop] = _stops(api_redis)
    assert (stop.task_run_id, stop.status) == (sent.task_run_id, TaskRunStatus.TIMED_OUT)
    assert stop.reason == "stopped: the run passed its time limit of 0.5 s"
    # The worker stops the task and reports it so; then the run lets go.
    _report(scheduler, sent, TaskRunStatus.TIMED_OUT, error=stop.reason, retryable=False)
    runs = _detail(api_client, run_id)["task_runs"]
    assert [(r["ref"], r["status"]) for r in runs] == [("nap", "TIMED_OUT")]
    assert uuid.UUID(run_id) not in scheduler.runs


def test_a_cancelled_runs_running_task_is_stopped_on_its_worker(
    scheduler: Scheduler, api_client: TestClient, api_redis: redis.Redis
) -> None:
    _fresh_worker(api_redis)
    flow = _define(api_client, [{"ref": "nap", "task": "sleep", "params": {"ms": 60_000}}])
    run_id = _start(api_client, flow)["id"]
    scheduler.claims.claim()
    [nap] = _queued(api_redis, run_id)  # the worker took it: it runs
    _cancel(scheduler, api_client, run_id)
    [stop] = _stops(api_redis)
    assert (stop.task_run_id, stop.status) == (nap.task_run_id, TaskRunStatus.CANCELLED)
    assert stop.reason == "stopped: the run was cancelled"
    _report(scheduler, nap, TaskRunStatus.CANCELLED, error=stop.reason, retryable=False)
    runs = _detail(api_client, run_id)["task_runs"]
    assert [(r["status"], r["error"]) for r in runs] == [("CANCELLED", stop.reason)]
    assert uuid.UUID(run_id) not in scheduler.runs


# --- waiting for a worker ------------------------------------------------------------------


def test_a_run_no_live_worker_can_take_says_what_it_waits_for_until_one_comes(
    scheduler: Scheduler, api_client: TestClient, api_redis: redis.Redis
) -> None:
    for key in (keys.WORKERS, keys.worker_key(WORKER), keys.worker_queue_key(WORKER)):
        api_redis.delete(key)
    ready = api_client.get("/api/readyz")
    assert ready.status_code == 503
    assert ready.json()["checks"]["workers"] == {
        "ok": False,
        "detail": "no live worker: none sent a heartbeat in the last 6 s; runs wait until one "
        "does: start workers (cdiflow up --workers N, or cdiflow worker)",
    }
    flow = _define(api_client, [{"ref": "first", "task": "noop"}])
    run_id = _start(api_client, flow)["id"]
    scheduler.claims.claim()
    scheduler.step()
    waiting = _detail(api_client, run_id)
    expected = (
        "waiting for a worker that loads 'workflows.image_tasks' to run step 'first': no "
        "worker is alive; start one (cdiflow up --workers N, or cdiflow worker)"
    )
    assert (waiting["status"], waiting["status_detail"]) == ("RUNNING", expected)
    [event] = [e for e in waiting["events"] if e["kind"] == "task.waiting"]
    assert event["data"] == {"ref": "first", "task": "noop", "module": "workflows.image_tasks",
                             "reason": expected}  # fmt: skip

    beat(api_redis, started_at=1000.0)  # a worker comes
    time.sleep(0.6)  # heartbeats are re-read at most twice a second
    scheduler.step()
    [placed] = _queued(api_redis, run_id)
    going = _detail(api_client, run_id)
    assert going["status_detail"] is None
    assert [e["kind"] for e in going["events"]][-2:] == ["task.waiting", "task.unblocked"]
    checks = api_client.get("/api/readyz").json()["checks"]
    assert checks["workers"] == {"ok": True, "detail": f"ok (1 live: {WORKER})"}
    _report(scheduler, placed, TaskRunStatus.COMPLETED)


def test_a_definitions_worker_wait_bounds_how_long_a_step_waits_for_a_worker(
    scheduler: Scheduler, api_client: TestClient, api_redis: redis.Redis
) -> None:
    for key in (keys.WORKERS, keys.worker_key(WORKER)):
        api_redis.delete(key)
    flow = _define(api_client, [{"ref": "first", "task": "noop"}], worker_wait_s=0.5)
    run_id = _start(api_client, flow)["id"]
    scheduler.claims.claim()
    while _detail(api_client, run_id)["status"] == "RUNNING":
        scheduler.step()
    done = _detail(api_client, run_id)
    assert done["status"] == "FAILED"
    assert done["error"] == (
        "step 'first' waited longer than the definition's worker_wait_s (0.5 s) for a worker "
        "able to run it: waiting for a worker that loads 'workflows.image_tasks' to run step "
        "'first': no worker is alive; start one (cdiflow up --workers N, or cdiflow worker)"
    )
    assert done["status_detail"] is None


def test_a_worker_starting_afresh_gets_nothing_until_its_new_process_beats(
    scheduler: Scheduler, api_client: TestClient, api_redis: redis.Redis
) -> None:
    _fresh_worker(api_redis, started_at=1000.0)
    flow = _define(api_client, [{"ref": "nap", "task": "sleep", "params": {"ms": 60_000}}])
    first = _start(api_client, flow)["id"]
    scheduler.claims.claim()
    [nap] = _queued(api_redis, first)
    _cancel(scheduler, api_client, first)
    assert len(_stops(api_redis)) == 1
    second = _start(api_client, flow)["id"]
    # The task would not stop: the worker reports it, ends its process and starts afresh.
    _report(scheduler, nap, TaskRunStatus.CANCELLED, retryable=False, restarting=True)
    scheduler.claims.claim()
    scheduler.step()
    assert _queued(api_redis, second) == [], "a task went to a process that is ending"
    beat(api_redis, started_at=2000.0)  # its fresh process
    scheduler.step()
    [placed] = _queued(api_redis, second)
    _cancel(scheduler, api_client, second)
    _report(scheduler, placed, TaskRunStatus.CANCELLED, retryable=False)
