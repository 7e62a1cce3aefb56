"""The controller's REST API and the state layer under it, on real Postgres and Redis."""

from __future__ import annotations

import asyncio
import functools
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
import redis
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from fastapi.testclient import TestClient
from redis.typing import EncodableT, FieldT
from sqlalchemy import Engine, make_url, text
from sqlalchemy.orm import Session, sessionmaker

from orchestrator.child_process import free_port
from orchestrator.contract import keys
from orchestrator.contract.messages import Report
from orchestrator.contract.vocabulary import DataPlane, Policy, TaskRunStatus, WorkflowStatus
from orchestrator.contract.wakeups import wake_message
from orchestrator.controller import create_app
from orchestrator.db import Base, async_run_store, make_engine, make_session_factory, migrate
from orchestrator.db import repository as repo
from orchestrator.db.migrate import head_revision
from orchestrator.db.run_statements import (
    CLAIM,
    FINISH,
    Finish,
    Handoff,
    Placement,
    claimed_from_row,
    finish_params,
)
from orchestrator.db.scheduler_store import SchedulerStore
from orchestrator.errors import ConfigError
from orchestrator.settings import Settings
from tests.orchestrator.api_support import admin_key_of, keyed_client

# Tasks are registered only when a live worker loaded them.
pytestmark = pytest.mark.usefixtures("task_worker")

IMAGE = {"image": "s3://cdiflow/images/cat.png"}


def _unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


@pytest.fixture
def flow(api_client: TestClient) -> str:
    """A fresh two-step workflow definition, so a test's runs are its own to count."""
    name = _unique("flow")
    body = {"name": name, "tasks": [{"ref": "a", "task": "noop"},
                                    {"ref": "b", "task": "noop", "depends_on": ["a"]}]}  # fmt: skip
    assert api_client.post("/api/workflow-definitions", json=body).status_code == 201
    return name


def _start(client: TestClient, workflow: str, **extra: Any) -> dict[str, Any]:
    response = client.post("/api/workflows", json={"workflow": workflow, "input": IMAGE, **extra})
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


def _set_status(sessions: sessionmaker[Session], workflow_id: str, status: WorkflowStatus) -> None:
    """RUNNING as a claim leaves it; a finished status as a scheduler's ending writes it."""
    with sessions() as session:
        if status is WorkflowStatus.RUNNING:
            session.execute(
                text("UPDATE workflows SET status = 'RUNNING', started_at = now() WHERE id = :id"),
                {"id": uuid.UUID(workflow_id)},
            )
        else:
            end = Finish(uuid.UUID(workflow_id), status, error="boom")
            assert session.connection().exec_driver_sql(FINISH, finish_params(end)).scalar()
        session.commit()


def _woken(client: redis.Redis) -> list[str]:
    return [str(v) for v in client.lrange(keys.WAKE, 0, -1)]


# --- start-up, health, docs ----------------------------------------------------------------


def test_healthz_and_docs(api_client: TestClient) -> None:
    health = api_client.get("/api/healthz")
    assert health.status_code == 200
    assert health.json() == {"status": "ok"}
    assert api_client.get("/docs").status_code == 200
    paths = api_client.get("/api/openapi.json").json()["paths"]
    assert {"/api/tasks", "/api/workflows/{workflow_id}/retry", "/api/workers"} <= set(paths)


def test_readyz_names_each_part_and_what_is_missing(
    api_client: TestClient, api_redis: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CDI_URL", raising=False)
    api_redis.delete(keys.SCHEDULERS)
    missing = api_client.get("/api/readyz")
    assert missing.status_code == 503
    checks = missing.json()["checks"]
    assert set(checks) == {"postgres", "redis", "minion", "scheduler", "s3"}
    assert checks["scheduler"]["ok"] is False and "no scheduler" in checks["scheduler"]["detail"]
    assert all(checks[name]["ok"] for name in ("postgres", "redis", "minion", "s3"))

    api_redis.hset(keys.SCHEDULERS, "scheduler-stalled", f"{time.time() - 60:.3f}")
    stalled = api_client.get("/api/readyz").json()["checks"]["scheduler"]
    assert not stalled["ok"] and "scheduler-stalled" in stalled["detail"]

    api_redis.hset(keys.SCHEDULERS, "scheduler-live", f"{time.time():.3f}")
    ready = api_client.get("/api/readyz")
    assert ready.status_code == 200, ready.text
    assert ready.json()["checks"]["scheduler"] == {"ok": True, "detail": "ok (scheduler-live)"}
    api_redis.delete(keys.SCHEDULERS)


def test_bundled_definitions_are_seeded_once(
    api_client: TestClient, api_sessions: sessionmaker[Session]
) -> None:
    tasks = {t["name"] for t in api_client.get("/api/tasks").json()}
    assert {"deblur", "denoise", "classify", "noop", "sleep"} <= tasks
    pipeline = api_client.get("/api/workflow-definitions/image_pipeline").json()
    assert [s["ref"] for s in pipeline["tasks"]] == ["deblur", "denoise", "classify"]
    assert pipeline["tasks"][1]["depends_on"] == ["deblur"]
    with api_sessions() as session:
        assert repo.seed_bundled_definitions(session) == []


def test_create_app_needs_database_and_redis(tmp_path: Any) -> None:
    with pytest.raises(ConfigError, match="REDIS_URL"):
        create_app(Settings(data_dir=tmp_path, database_url="postgresql://u@h/db", redis_url=None))


# --- task definitions ----------------------------------------------------------------------


def test_task_lifecycle(api_client: TestClient) -> None:
    name = _unique("sharpen")
    module = "tests.orchestrator.flaky_tasks:echo_input"
    body = {"name": name, "module": module, "timeout_s": 5, "retries": 1,
            "description": "sharpens"}  # fmt: skip
    created = api_client.post("/api/tasks", json=body)
    assert created.status_code == 201, created.text
    assert created.headers["location"] == f"/api/tasks/{name}"
    assert created.json()["retry_backoff_s"] == 0.5  # left out: the @task's
    got = api_client.get(f"/api/tasks/{name}").json()
    assert (got["module"], got["timeout_s"], got["description"]) == (module, 5, "sharpens")
    assert name in {t["name"] for t in api_client.get("/api/tasks").json()}
    again = api_client.post("/api/tasks", json=body)
    assert again.status_code == 409 and "already exists" in again.json()["detail"]
    assert api_client.delete(f"/api/tasks/{name}").status_code == 204
    assert api_client.get(f"/api/tasks/{name}").status_code == 404
    missing = api_client.delete(f"/api/tasks/{name}")
    assert missing.status_code == 404 and missing.json()["code"] == "not_found"


def test_task_used_by_a_workflow_cannot_be_deleted(api_client: TestClient, flow: str) -> None:
    response = api_client.delete("/api/tasks/noop")
    assert response.status_code == 409
    assert flow in response.json()["detail"] and "noop_pipeline" in response.json()["detail"]


@pytest.mark.parametrize(
    ("change", "field", "says"),
    [
        ({"module": "no_colon"}, "module", "package.module:function"),
        ({"module": "pkg.mod:"}, "module", "package.module:function"),
        ({"module": "pkg..mod:fn"}, "module", "package.module:function"),
        ({"name": "1bad"}, "name", "not valid"),
        ({"timeout_s": 0}, "timeout_s", "greater than 0"),
        ({"timeout_s": 10**9}, "timeout_s", "less than or equal"),
        ({"retries": -1}, "retries", "greater than or equal to 0"),
        ({"retries": 11}, "retries", "less than or equal to 10"),
        ({"retry_backoff_s": -1}, "retry_backoff_s", "greater than or equal"),
        ({"colour": "red"}, "colour", "Extra inputs"),
    ],
)
def test_task_validation(
    api_client: TestClient, change: dict[str, Any], field: str, says: str
) -> None:
    body = {"name": _unique("t"), "module": "pkg.mod:fn", **change}
    response = api_client.post("/api/tasks", json=body)
    assert response.status_code == 422
    [error] = response.json()["detail"]
    assert error["loc"][-1] == field and says in error["msg"]


# --- workflow definitions ------------------------------------------------------------------


def test_workflow_definition_lifecycle(api_client: TestClient, flow: str) -> None:
    got = api_client.get(f"/api/workflow-definitions/{flow}").json()
    assert got["tasks"] == [
        {"ref": "a", "task": "noop", "depends_on": [], "params": {}},
        {"ref": "b", "task": "noop", "depends_on": ["a"], "params": {}},
    ]
    assert flow in {d["name"] for d in api_client.get("/api/workflow-definitions").json()}
    again = api_client.post("/api/workflow-definitions", json={"name": flow, "tasks": got["tasks"]})
    assert again.status_code == 409
    missing = api_client.get("/api/workflow-definitions/nope")
    assert missing.status_code == 404 and "image_pipeline" in missing.json()["known"]


@pytest.mark.parametrize(
    ("tasks", "says"),
    [
        ([{"ref": "a", "task": "noop"}, {"ref": "b", "task": "sharpen"}],
         ["tasks[1]", "unknown task 'sharpen'"]),
        ([{"ref": "a", "task": "noop"}, {"ref": "a", "task": "noop"}],
         ["tasks[1]", "duplicate ref 'a'"]),
        ([{"ref": "a", "task": "noop", "depends_on": ["ghost"]}],
         ["step 'a'", "unknown step 'ghost'"]),
        ([{"ref": "a", "task": "noop", "depends_on": ["b"]},
          {"ref": "b", "task": "noop", "depends_on": ["a"]}],
         ["dependency cycle", "a -> b -> a"]),
        ([], ["'tasks' is empty"]),
        # a join must say which of its inputs is which
        ([{"ref": "a", "task": "noop"}, {"ref": "b1", "task": "noop", "depends_on": ["a"]},
          {"ref": "b2", "task": "noop", "depends_on": ["a"]},
          {"ref": "c", "task": "noop", "depends_on": ["b1", "b2"]}],
         ["step 'c': depends on 2 steps", "names no 'inputs'", '"b1": "b1.image"']),
    ],
)  # fmt: skip
def test_workflow_definition_problems_are_named(
    api_client: TestClient, tasks: list[dict[str, Any]], says: list[str]
) -> None:
    name = _unique("bad")
    response = api_client.post("/api/workflow-definitions", json={"name": name, "tasks": tasks})
    assert response.status_code == 422
    body = response.json()
    assert body["code"] == "invalid_definition"
    assert all(any(s in p for p in body["problems"]) for s in says), body["problems"]
    assert all(s in body["detail"] for s in says)
    assert api_client.get(f"/api/workflow-definitions/{name}").status_code == 404


def test_workflow_definition_shape_errors(api_client: TestClient) -> None:
    bad_name = {"name": "has space", "tasks": [{"ref": "a", "task": "noop"}]}
    response = api_client.post("/api/workflow-definitions", json=bad_name)
    assert response.status_code == 422 and "'has space' is not valid" in response.text
    no_ref = {"name": _unique("x"), "tasks": [{"task": "noop"}]}
    assert api_client.post("/api/workflow-definitions", json=no_ref).status_code == 422


# --- starting workflows --------------------------------------------------------------------


def test_start_workflow(api_client: TestClient, api_redis: redis.Redis) -> None:
    body = _start(api_client, "image_pipeline")
    assert body["status"] == "PENDING" and body["workflow"] == "image_pipeline"
    assert (body["policy"], body["data_plane"], body["input"]) == ("affinity", "cdi", IMAGE)
    assert body["claimed_by"] is None and body["finished_at"] is None
    assert _woken(api_redis)[0] == body["id"]  # LPUSH: the newest is at the head
    other = _start(api_client, "noop_pipeline", policy="auto", data_plane="object-store")
    assert (other["policy"], other["data_plane"]) == ("auto", "object-store")


def test_unknown_workflow_lists_the_known_ones(api_client: TestClient) -> None:
    response = api_client.post("/api/workflows", json={"workflow": "nope", "input": IMAGE})
    assert response.status_code == 404
    body = response.json()
    assert {"image_pipeline", "noop_pipeline"} <= set(body["known"])
    assert "'nope' not found" in body["detail"]


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"policy": "fastest"}, "'affinity', 'transfer' or 'auto'"),
        ({"data_plane": "nfs"}, "'cdi' or 'object-store'"),
        ({"data_plane": "none"}, "'cdi' or 'object-store'"),  # a dataless run's, not a choice
        ({"input": {"image": "http://host/cat.png"}}, "not an S3 URI"),
        ({"input": {"image": "s3://cdiflow"}}, "not an S3 URI"),
        ({"input": {"image": "s3://cdiflow/"}}, "no object key"),
        ({"input": {"image": "s3://Bad_Bucket/key"}}, "not a valid S3 bucket name"),
        ({"input": {"image": "s3:///key"}}, "not a valid S3 bucket name"),
        ({"input": {"data": [1, 2]}}, "valid dictionary"),
        ({"input": {**IMAGE, "imgae": "x"}}, "Extra inputs"),
    ],
)
def test_start_validation(api_client: TestClient, change: dict[str, Any], says: str) -> None:
    response = api_client.post("/api/workflows", json={"workflow": "image_pipeline",
                                                       "input": IMAGE, **change})  # fmt: skip
    assert response.status_code == 422
    assert says in response.text


def test_a_graph_on_the_object_store_plane_is_refused_saying_to_use_the_cdi_plane(
    api_client: TestClient,
) -> None:
    """The object-store plane carries one image from step to step: a fork cannot run on it."""
    body = {"workflow": "fork_join_pipeline", "input": IMAGE, "data_plane": "object-store"}
    response = api_client.post("/api/workflows", json=body)
    assert response.status_code == 422, response.text
    assert "start the run on the cdi plane" in response.text
    assert "steps 'sharpen', 'smooth' all start the workflow" in response.text
    assert _start(api_client, "fork_join_pipeline")["data_plane"] == "cdi"


def test_start_without_image_is_dataless(api_client: TestClient) -> None:
    """No image: a dataless run, stored with exactly what was given (no nulls)."""
    body = {"workflow": "noop_pipeline", "input": {"data": {"order": 42}}}
    response = api_client.post("/api/workflows", json=body)
    assert response.status_code == 201, response.text
    assert response.json()["input"] == {"data": {"order": 42}}
    bare = api_client.post("/api/workflows", json={"workflow": "noop_pipeline", "input": {}})
    assert bare.status_code == 201, bare.text
    assert bare.json()["input"] == {}


def test_long_poll_answers_at_its_deadline_and_validates(api_client: TestClient) -> None:
    """No scheduler runs here: a PENDING run is answered as it is once ``wait_s`` passed."""
    started = api_client.post("/api/workflows", json={"workflow": "noop_pipeline", "input": {}})
    workflow_id = started.json()["id"]
    began = time.monotonic()
    reply = api_client.get(f"/api/workflows/{workflow_id}", params={"wait_s": 0.3})
    assert reply.status_code == 200, reply.text
    assert reply.json()["status"] == "PENDING"
    assert time.monotonic() - began >= 0.3
    missing = api_client.get(f"/api/workflows/{uuid.uuid4()}", params={"wait_s": 5})
    assert missing.status_code == 404
    too_long = api_client.get(f"/api/workflows/{workflow_id}", params={"wait_s": 61})
    assert too_long.status_code == 422
    assert "wait_s" in too_long.text


def _answer_while_ending(
    client: TestClient, end: Callable[[str], None]
) -> tuple[dict[str, Any], float]:
    """Start a run, wait for it with a 50 s long poll, and ``end(id)`` it meanwhile: the
    answer and how long the request took."""
    started = client.post("/api/workflows", json={"workflow": "noop_pipeline", "input": {}})
    workflow_id = started.json()["id"]
    answers: list[dict[str, Any]] = []

    def wait() -> None:
        reply = client.get(f"/api/workflows/{workflow_id}", params={"wait_s": 50})
        answers.append(reply.json())

    waiter = threading.Thread(target=wait)
    began = time.monotonic()
    waiter.start()
    time.sleep(0.3)
    end(workflow_id)
    waiter.join(timeout=60)
    assert answers, "the long poll never answered"
    return answers[0], time.monotonic() - began


def test_long_poll_returns_when_the_run_ends(api_client: TestClient) -> None:
    """A cancel ends the run: the waiting request answers then, not at its deadline."""

    def cancel(workflow_id: str) -> None:
        assert api_client.post(f"/api/workflows/{workflow_id}/cancel").status_code == 200

    answer, took_s = _answer_while_ending(api_client, cancel)
    assert answer["status"] == "CANCELLED"
    assert took_s < 40  # well before the 50 s deadline


def test_long_poll_finds_an_end_nobody_announced(
    api_client: TestClient, api_sessions: sessionmaker[Session]
) -> None:
    """A run ended without a publish (as when a scheduler dies between its commit and its
    publish): the API's sweep finds it, and the waiting request answers long before its
    deadline."""

    def fail_unannounced(workflow_id: str) -> None:
        _set_status(api_sessions, workflow_id, WorkflowStatus.FAILED)

    answer, took_s = _answer_while_ending(api_client, fail_unannounced)
    assert answer["status"] == "FAILED"
    assert took_s < 40  # well before the 50 s deadline


def test_start_and_wait_answers_with_the_detail(api_client: TestClient) -> None:
    """No scheduler here: the run is still PENDING at the deadline, answered in full."""
    reply = api_client.post(
        "/api/workflows", params={"wait_s": 0.2}, json={"workflow": "noop_pipeline", "input": {}}
    )
    assert reply.status_code == 201, reply.text
    body = reply.json()
    assert body["status"] == "PENDING" and body["task_runs"] == [] and body["events"] == []
    assert reply.headers["location"] == f"/api/workflows/{body['id']}"
    too_long = api_client.post(
        "/api/workflows", params={"wait_s": 99}, json={"workflow": "noop_pipeline", "input": {}}
    )
    assert too_long.status_code == 422


def test_start_and_wait_returns_when_the_run_ends(api_client: TestClient) -> None:
    """The request listens before the run exists: a cancel ends it, and the answer comes then
    (from the announcement, not from the deadline)."""
    answers: list[dict[str, Any]] = []

    def start_and_wait() -> None:
        reply = api_client.post(
            "/api/workflows",
            params={"wait_s": 50},
            json={"workflow": "noop_pipeline", "input": {}},
        )
        answers.append(reply.json())

    waiter = threading.Thread(target=start_and_wait)
    began = time.monotonic()
    waiter.start()
    pending: list[dict[str, Any]] = []
    while not pending and time.monotonic() - began < 30:
        time.sleep(0.05)
        pending = api_client.get("/api/workflows", params={"status": "PENDING"}).json()["items"]
    assert pending, f"the run never showed up: {answers}"
    workflow_id = pending[0]["id"]
    assert api_client.post(f"/api/workflows/{workflow_id}/cancel").status_code == 200
    waiter.join(timeout=60)
    assert answers and answers[0]["id"] == workflow_id
    assert answers[0]["status"] == "CANCELLED"
    assert time.monotonic() - began < 40  # well before the 50 s deadline


# --- listing -------------------------------------------------------------------------------


def test_list_filters_and_pages(
    api_client: TestClient, api_sessions: sessionmaker[Session], flow: str
) -> None:
    runs = [_start(api_client, flow, policy=p) for p in ("affinity", "transfer", "auto") * 2]
    _set_status(api_sessions, runs[0]["id"], WorkflowStatus.CANCELLED)

    def listed(**params: Any) -> tuple[list[str], int]:
        response = api_client.get("/api/workflows", params={"workflow": flow, **params})
        assert response.status_code == 200, response.text
        return [w["id"] for w in response.json()["items"]], response.json()["total"]

    newest_first = [r["id"] for r in reversed(runs)]
    assert listed() == (newest_first, 6)
    pages = [listed(limit=4, offset=o) for o in (0, 4, 8)]
    assert [p[0] for p in pages] == [newest_first[:4], newest_first[4:], []]
    assert {p[1] for p in pages} == {6}
    assert listed(status="CANCELLED") == ([runs[0]["id"]], 1)
    assert listed(status="PENDING")[1] == 5
    assert listed(policy="transfer") == ([runs[4]["id"], runs[1]["id"]], 2)
    third = runs[2]["created_at"]
    assert listed(created_after=third)[0] == newest_first[:4]
    assert listed(created_before=third)[0] == newest_first[4:]
    prefix = runs[3]["id"][:8]
    assert runs[3]["id"] in listed(q=prefix.upper())[0]
    assert listed(q=runs[3]["id"]) == ([runs[3]["id"]], 1)
    assert listed(workflow="nope") == ([], 0)  # the kwarg replaces the default filter


@pytest.mark.parametrize(
    "params",
    [{"limit": 0}, {"limit": 201}, {"offset": -1}, {"status": "DONE"}, {"policy": "x"},
     {"q": "zz%"}, {"created_after": "yesterday"}],
)  # fmt: skip
def test_list_rejects_bad_parameters(api_client: TestClient, params: dict[str, Any]) -> None:
    assert api_client.get("/api/workflows", params=params).status_code == 422


# --- one workflow --------------------------------------------------------------------------


def test_workflow_detail(api_client: TestClient, api_store: SchedulerStore) -> None:
    """The detail shows every attempt and hand-off the scheduler's statements record."""
    run = _start(api_client, "image_pipeline")
    wid = uuid.UUID(run["id"])
    moved = Handoff("scheduler", "w1", 1024, 12.5)
    first = Placement(
        api_store.next_task_run_id(), wid, "deblur", "deblur", 1, "w1", 999.0, (moved,)
    )
    api_store.place([first])
    failed = Report(first.task_run_id, str(wid), "w1", TaskRunStatus.FAILED, 1000.0, 1000.5,
                    error="worker died", bytes_in=1024)  # fmt: skip
    second = Placement(api_store.next_task_run_id(), wid, "deblur", "deblur", 2, "w2", 1001.0)
    assert api_store.report(failed, (), [second]) is False  # placed the retry, ended nothing
    detail = api_client.get(f"/api/workflows/{wid}").json()
    assert detail["id"] == run["id"] and detail["status"] == "PENDING"
    runs = detail["task_runs"]
    assert [(r["attempt"], r["worker_id"], r["status"]) for r in runs] == [
        (1, "w1", "FAILED"),
        (2, "w2", "QUEUED"),
    ]
    assert (runs[0]["bytes_in"], runs[0]["run_ms"], runs[0]["queue_wait_ms"]) == (
        1024,
        500.0,
        1000.0,
    )
    assert runs[0]["error"] == "worker died"
    [handoff] = detail["handoffs"]
    assert (handoff["to_container"], handoff["bytes"], handoff["task_run_id"]) == (
        "w1",
        1024,
        runs[0]["id"],
    )
    assert [e["kind"] for e in detail["events"]] == ["workflow.created", "task.failed"]
    assert api_client.get(f"/api/workflows/{wid}", params={"events": 0}).json()["events"] == []


def test_task_runs_within_a_window_come_page_by_page(
    api_client: TestClient, api_store: SchedulerStore
) -> None:
    """What ran, at least in part, between two moments, across workflows (a benchmark reads
    each worker's busy time from it)."""
    wid = uuid.UUID(_start(api_client, "noop_pipeline")["id"])
    now = time.time()
    spans = {
        "before": (now - 30, now - 20),
        "across": (now - 15, now - 5),
        "inside": (now - 4, now - 3),
    }
    ids = {}
    for attempt, (ref, (started, finished)) in enumerate(spans.items(), start=1):
        task_run_id = api_store.next_task_run_id()
        placed = Placement(task_run_id, wid, ref, "noop", 1, f"w{attempt}", started)
        api_store.place([placed])
        done = Report(placed.task_run_id, str(wid), f"w{attempt}", TaskRunStatus.COMPLETED,
                      started, finished, cpu_ms=1.5)  # fmt: skip
        api_store.report(done)
        ids[ref] = placed.task_run_id
    window = {
        "finished_after": datetime.fromtimestamp(now - 10, UTC).isoformat(),
        "started_before": datetime.fromtimestamp(now, UTC).isoformat(),
    }
    listed = api_client.get("/api/task-runs", params=window).json()
    assert [(r["id"], r["workflow_id"], r["worker_id"], r["cpu_ms"]) for r in listed] == [
        (ids["across"], str(wid), "w2", 1.5),
        (ids["inside"], str(wid), "w3", 1.5),
    ]
    first = api_client.get("/api/task-runs", params={**window, "limit": 1}).json()
    rest = api_client.get(
        "/api/task-runs", params={**window, "limit": 1, "after_id": first[-1]["id"]}
    ).json()
    assert [r["id"] for r in first + rest] == [ids["across"], ids["inside"]]
    assert api_client.get("/api/task-runs", params={"finished_after": "soon"}).status_code == 422


def test_workflow_lookup_errors(api_client: TestClient) -> None:
    missing = api_client.get(f"/api/workflows/{uuid.uuid4()}")
    assert missing.status_code == 404 and missing.json()["code"] == "not_found"
    assert api_client.get("/api/workflows/not-a-uuid").status_code == 422
    assert api_client.post(f"/api/workflows/{uuid.uuid4()}/cancel").status_code == 404
    assert api_client.post("/api/workflows/123/retry").status_code == 422


# --- cancel and retry ----------------------------------------------------------------------


@pytest.mark.parametrize("before", [WorkflowStatus.PENDING, WorkflowStatus.RUNNING])
def test_cancel(
    api_client: TestClient,
    api_sessions: sessionmaker[Session],
    api_redis: redis.Redis,
    before: WorkflowStatus,
) -> None:
    run = _start(api_client, "noop_pipeline")
    if before is WorkflowStatus.RUNNING:
        _set_status(api_sessions, run["id"], before)
    api_redis.delete(keys.WAKE)
    response = api_client.post(f"/api/workflows/{run['id']}/cancel")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "CANCELLED" and body["finished_at"] is not None
    assert (body["started_at"] is not None) is (before is WorkflowStatus.RUNNING)
    assert _woken(api_redis) == [wake_message(uuid.UUID(run["id"]), cancel=True)]
    again = api_client.post(f"/api/workflows/{run['id']}/cancel")
    assert again.status_code == 409 and "already finished" in again.json()["detail"]


@pytest.mark.parametrize("final", [WorkflowStatus.COMPLETED, WorkflowStatus.FAILED])
def test_finished_runs_cannot_be_cancelled(
    api_client: TestClient,
    api_sessions: sessionmaker[Session],
    api_store: SchedulerStore,
    final: WorkflowStatus,
) -> None:
    run = _start(api_client, "noop_pipeline")
    _set_status(api_sessions, run["id"], final)
    assert api_client.post(f"/api/workflows/{run['id']}/cancel").status_code == 409
    # Nor ended again by a scheduler: the first ending stands.
    again = Finish(uuid.UUID(run["id"]), WorkflowStatus.FAILED, error="late")
    assert api_store.finish(again) is False
    assert api_client.get(f"/api/workflows/{run['id']}").json()["status"] == final


@pytest.mark.parametrize("final", [WorkflowStatus.FAILED, WorkflowStatus.CANCELLED])
def test_retry(
    api_client: TestClient,
    api_sessions: sessionmaker[Session],
    api_redis: redis.Redis,
    final: WorkflowStatus,
) -> None:
    run = _start(api_client, "image_pipeline", policy="transfer", data_plane="object-store")
    _set_status(api_sessions, run["id"], final)
    api_redis.delete(keys.WAKE)
    response = api_client.post(f"/api/workflows/{run['id']}/retry")
    assert response.status_code == 201
    new = response.json()
    assert new["id"] != run["id"] and new["status"] == "PENDING" and new["retry_of"] == run["id"]
    same = ("workflow", "input", "policy", "data_plane")
    assert {k: new[k] for k in same} == {k: run[k] for k in same}
    assert response.headers["location"] == f"/api/workflows/{new['id']}"
    assert _woken(api_redis) == [new["id"]]
    old = api_client.get(f"/api/workflows/{run['id']}").json()
    assert old["status"] == final  # the original stays as it was


@pytest.mark.parametrize("state", [None, WorkflowStatus.RUNNING, WorkflowStatus.COMPLETED])
def test_only_failed_or_cancelled_runs_are_retried(
    api_client: TestClient, api_sessions: sessionmaker[Session], state: WorkflowStatus | None
) -> None:
    run = _start(api_client, "noop_pipeline")
    if state is not None:
        _set_status(api_sessions, run["id"], state)
    response = api_client.post(f"/api/workflows/{run['id']}/retry")
    assert response.status_code == 409
    assert "only FAILED or CANCELLED" in response.json()["detail"]


# --- workers -------------------------------------------------------------------------------


def test_workers_from_heartbeats(api_client: TestClient, api_redis: redis.Redis) -> None:
    now = time.time()
    fresh, stale, garbled, gone = (_unique(w) for w in ("fresh", "stale", "garbled", "gone"))
    silent_for = 3.5 * keys.HEARTBEAT_INTERVAL_S  # past the 3-interval limit
    beats: dict[str, dict[FieldT, EncodableT]] = {
        fresh: {"cpu": "97.5", "mem": "40", "queue_depth": "3", "running": "1", "slots": "2",
                "host": "h1", "held_images": "2", "held_bytes": "52428800",
                "last_heartbeat": now - 1, "started_at": now - 60, "proc_cpu": "12.5",
                "proc_rss": "104857600", "proc_mem": "1.3"},
        stale: {"cpu": "1", "host": "h2", "last_heartbeat": now - silent_for},
        garbled: {"cpu": "lots", "queue_depth": "nan", "last_heartbeat": now},
    }  # fmt: skip
    for worker_id, fields in beats.items():
        api_redis.hset(keys.worker_key(worker_id), mapping=fields)
    api_redis.sadd(keys.WORKERS, fresh, stale, garbled, gone)
    listed = {w["id"]: w for w in api_client.get("/api/workers").json()}
    assert listed[fresh]["alive"] is True
    assert (listed[fresh]["cpu"], listed[fresh]["queue_depth"], listed[fresh]["host"]) == (
        12.5,
        3,
        "h1",
    )
    # The process's own CPU and memory; the host's beside them.
    assert (listed[fresh]["mem"], listed[fresh]["rss_bytes"]) == (1.3, 104857600)
    assert (listed[fresh]["host_cpu"], listed[fresh]["host_mem"]) == (97.5, 40)
    assert listed[stale]["cpu"] is None and listed[stale]["host_cpu"] == 1
    assert listed[fresh]["slots"] == 2 and listed[stale]["slots"] is None
    assert (listed[fresh]["held_images"], listed[fresh]["held_bytes"]) == (2, 52428800)
    assert listed[stale]["held_images"] is None  # an older worker's heartbeat has no such field
    assert 0.5 < listed[fresh]["heartbeat_age_s"] < 5
    assert listed[stale]["alive"] is False and listed[stale]["host"] == "h2"
    assert listed[garbled]["alive"] is True
    assert (listed[garbled]["cpu"], listed[garbled]["queue_depth"]) == (None, None)
    assert listed[gone]["alive"] is False and listed[gone]["last_heartbeat"] is None


# --- request size --------------------------------------------------------------------------


def test_bodies_over_one_mebibyte_are_refused(api_client: TestClient) -> None:
    big = b'{"workflow": "image_pipeline", "input": {"image": "' + b"x" * (1 << 20) + b'"}}'
    declared = api_client.post(
        "/api/workflows", content=big, headers={"content-type": "application/json"}
    )
    assert declared.status_code == 413
    assert declared.json()["code"] == "request_too_large" and "1 MiB" in declared.json()["detail"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: the size is only known by counting
        for start in range(0, len(big), 64 * 1024):
            yield big[start : start + 64 * 1024]

    streamed = api_client.post(
        "/api/workflows", content=chunks(), headers={"content-type": "application/json"}
    )
    assert streamed.status_code == 413 and streamed.json()["code"] == "request_too_large"
    small = api_client.post("/api/workflows", content=big[: 1 << 19], headers={
        "content-type": "application/json"})  # fmt: skip
    assert small.status_code == 422  # under the limit: parsed (and found broken)


# --- services down -------------------------------------------------------------------------


def test_redis_down(api_settings: Settings) -> None:
    dead = api_settings.model_copy(update={"redis_url": f"redis://127.0.0.1:{free_port()}/0"})
    with keyed_client(create_app(dead), admin_key_of(dead)) as client:
        assert client.get("/api/healthz").status_code == 200  # the process itself lives
        ready = client.get("/api/readyz")
        assert ready.status_code == 503
        checks = ready.json()["checks"]
        assert checks["postgres"] == {"ok": True, "detail": "ok"}
        assert not checks["redis"]["ok"] and "unavailable" in checks["redis"]["detail"]
        workers = client.get("/api/workers")
        assert workers.status_code == 503 and workers.json()["code"] == "service"
        # The run is committed in Postgres; the lost wake-up only delays the scheduler's poll.
        assert client.post("/api/workflows", json={"workflow": "noop_pipeline",
                                                   "input": IMAGE}).status_code == 201  # fmt: skip


def _drop_connections(database_url: str) -> int:
    """Terminate every other session on ``database_url``'s database, as a restarted Postgres
    would; how many there were."""
    url = make_url(database_url)
    with psycopg.connect(
        host=url.host, port=url.port, user=url.username, password=url.password,
        dbname=url.database, autocommit=True,
    ) as conn:  # fmt: skip
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()
    return len(rows)


def test_a_start_after_postgres_dropped_idle_connections_succeeds(
    make_database: Callable[[str], str],
    api_settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Connections idle for a while are checked before use: a Postgres restart while the API
    waited costs no request."""
    database_url = make_database("api_dropped")
    settings = api_settings.model_copy(update={"database_url": database_url})
    with keyed_client(create_app(settings), admin_key_of(settings)) as client:
        first = client.post("/api/workflows", json={"workflow": "noop_pipeline", "input": IMAGE})
        assert first.status_code == 201, first.text
        assert _drop_connections(database_url) >= 1
        monkeypatch.setattr(async_run_store, "CHECK_IDLE_S", 0.0)  # as if the API had waited
        again = client.post("/api/workflows?wait_s=0.05", json={"workflow": "noop_pipeline",
                                                                "input": IMAGE})  # fmt: skip
        assert again.status_code == 201, again.text
        assert client.get(f"/api/workflows/{first.json()['id']}").status_code == 200


def test_a_connection_dropped_in_steady_use_costs_no_request(
    make_database: Callable[[str], str], api_settings: Settings
) -> None:
    """A connection in steady use is not pinged: if Postgres drops it, the statement runs
    again on another connection, a read as a start."""
    database_url = make_database("api_steady")
    settings = api_settings.model_copy(update={"database_url": database_url})
    body = {"workflow": "noop_pipeline", "input": IMAGE}
    with keyed_client(create_app(settings), admin_key_of(settings)) as client:
        started = client.post("/api/workflows", json=body)
        assert started.status_code == 201
        assert _drop_connections(database_url) >= 1
        read = client.get(f"/api/workflows/{started.json()['id']}?wait_s=0.01")
        assert read.status_code == 200 and read.json()["status"] == "PENDING", read.text
        assert _drop_connections(database_url) >= 1
        again = client.post("/api/workflows", json=body)
        assert again.status_code == 201, again.text
        assert client.get("/api/workflows").json()["total"] == 2


def test_a_start_sent_twice_inserts_its_run_once(
    make_database: Callable[[str], str], api_settings: Settings
) -> None:
    """What a start tried again after its connection dropped does, if the first try had
    committed: it finds the run instead of inserting it (and its event) again."""
    database_url = make_database("api_twice")
    settings = api_settings.model_copy(update={"database_url": database_url})
    # migrated and seeded
    with keyed_client(create_app(settings), admin_key_of(settings)) as client:

        async def start_twice() -> tuple[Any, Any]:
            runs = async_run_store.AsyncRunStore(make_url(database_url))
            await runs.open()
            try:
                workflow_id = uuid.uuid4()
                start = functools.partial(
                    runs.create, "noop_pipeline", IMAGE, policy=Policy.AFFINITY,
                    data_plane=DataPlane.CDI, workflow_id=workflow_id,
                )  # fmt: skip
                return await start(), await start()
            finally:
                await runs.close()

        first, second = asyncio.run(start_twice())
        assert first.id == second.id and first.created_at == second.created_at
        detail = client.get(f"/api/workflows/{first.id}").json()
        assert [e["kind"] for e in detail["events"]] == ["workflow.created"]
        assert client.get("/api/workflows").json()["total"] == 1


# --- the state layer -----------------------------------------------------------------------


@pytest.fixture
def claim_database(make_database: Callable[[str], str]) -> Iterator[Engine]:
    """A database of its own (a claim takes every PENDING run it finds), seeded, with an
    engine on it."""
    url = make_database("claims")
    migrate(url)
    engine = make_engine(url)
    with make_session_factory(engine)() as session:
        repo.seed_bundled_definitions(session)
        session.commit()
    yield engine
    engine.dispose()


def _pending_runs(engine: Engine, count: int) -> set[uuid.UUID]:
    with make_session_factory(engine)() as session:
        made = [repo.create_workflow(session, "noop_pipeline", {}) for _ in range(count)]
        session.commit()
        return {w.id for w in made}


def test_concurrent_claims_never_overlap(claim_database: Engine) -> None:
    """Two schedulers claim at the same moment, each holding its row locks a while before
    it commits: ``SKIP LOCKED`` makes each skip the other's rows."""
    pending = _pending_runs(claim_database, 30)
    claims: dict[str, list[uuid.UUID]] = {"s1": [], "s2": []}
    last_batch = {"s1": -1, "s2": -1}
    barrier = threading.Barrier(2)
    dsn = claim_database.url.set(drivername="postgresql").render_as_string(hide_password=False)

    def scheduler(name: str) -> None:
        with psycopg.connect(dsn) as conn:
            while True:
                barrier.wait(timeout=30)  # both claim at the same moment, every round
                with conn.transaction():
                    params = {"me": name, "limit": 4, "reclaim_s": 60.0}
                    batch = [claimed_from_row(r) for r in conn.execute(CLAIM, params)]
                    time.sleep(0.02)  # hold the row locks while the other one claims
                claims[name] += [c.id for c in batch]
                last_batch[name] = len(batch)
                barrier.wait(timeout=30)  # both rounds done: both read the same last_batch
                if not any(last_batch.values()):
                    return

    threads = [threading.Thread(target=scheduler, args=(n,)) for n in claims]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    s1, s2 = claims["s1"], claims["s2"]
    assert s1 and s2 and not set(s1) & set(s2)
    assert sorted(s1 + s2) == sorted(pending)  # every one claimed, exactly once
    with claim_database.connect() as conn:
        query = text("SELECT id, claimed_by FROM workflows WHERE status = 'RUNNING'")
        owners = {wid: owner for wid, owner in conn.execute(query)}
    assert all(owners[w] == "s1" for w in s1) and all(owners[w] == "s2" for w in s2)


def test_stale_claims_are_taken_over(claim_database: Engine) -> None:
    """A PENDING run whose claim is older than the reclaim time is claimed again."""
    [run] = _pending_runs(claim_database, 1)
    with claim_database.begin() as conn:
        conn.execute(
            text("UPDATE workflows SET claimed_by = 'old', claimed_at = now() - interval '1 hour'")
        )
    store = SchedulerStore(claim_database)
    try:
        assert store.claim("new", 1000, reclaim_after_s=2 * 3600) == []
        [taken] = store.claim("new", 1000, reclaim_after_s=60)
        assert (taken.id, taken.definition, taken.policy) == (run, "noop_pipeline", "affinity")
        assert store.status(run) is WorkflowStatus.RUNNING
    finally:
        store.close()


def test_migrate_is_idempotent_and_matches_the_models(api_database_url: str) -> None:
    head = head_revision()
    assert head is not None
    assert migrate(api_database_url) == head  # the app already migrated: nothing to do
    assert migrate(api_database_url) == head
    engine = make_engine(api_database_url, pooled=False)
    try:
        with engine.connect() as conn:
            assert conn.scalar(text("SELECT count(*) FROM alembic_version")) == 1
            assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []
    finally:
        engine.dispose()


def test_concurrent_first_migrations(make_database: Callable[[str], str]) -> None:
    url = make_database("migrate")
    results: list[str | None] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(migrate(url))
        except BaseException as exc:  # reported below, with the thread's traceback
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == [] and results == [head_revision()] * 3
