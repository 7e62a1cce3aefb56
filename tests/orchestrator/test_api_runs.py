"""Workflow runs through the REST API on real Postgres and Redis: starting one, waiting for its
end, listing, one run's detail, cancel and retry."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient
from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from orchestrator.contract import keys
from orchestrator.contract.messages import Report
from orchestrator.contract.vocabulary import TaskRunStatus, WorkflowStatus
from orchestrator.contract.wakeups import wake_message
from orchestrator.db.run_statements import FINISH, Finish, Handoff, Placement, finish_params
from orchestrator.db.scheduler_store import SchedulerStore

# Tasks are registered only when a live worker loaded them.
pytestmark = pytest.mark.usefixtures("task_worker")

IMAGE = {"image": "s3://cdiflow/images/cat.png"}


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


def test_the_last_report_logs_the_tasks_end_before_the_runs(
    api_client: TestClient, api_store: SchedulerStore
) -> None:
    """The report that ends a run writes both events in one statement: a client reading
    events in id order sees the step end, then the run."""
    wid = uuid.UUID(_start(api_client, "noop_pipeline")["id"])
    placed = Placement(api_store.next_task_run_id(), wid, "noop1", "noop", 1, "w1", 999.0)
    api_store.place([placed])
    done = Report(placed.task_run_id, str(wid), "w1", TaskRunStatus.COMPLETED, 1000.0, 1000.5)
    assert api_store.report(done, (), [], Finish(wid, WorkflowStatus.COMPLETED, output={}))
    events = api_client.get(f"/api/workflows/{wid}/events").json()["events"]
    kinds = [e["kind"] for e in events]
    assert kinds == ["workflow.created", "task.completed", "workflow.completed"]


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


@pytest.mark.parametrize(
    "final", [WorkflowStatus.COMPLETED, WorkflowStatus.FAILED, WorkflowStatus.TIMED_OUT]
)
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


@pytest.mark.parametrize(
    "final", [WorkflowStatus.FAILED, WorkflowStatus.CANCELLED, WorkflowStatus.TIMED_OUT]
)
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
    same = ("workflow", "input", "policy", "data_plane", "timeout_s")
    assert {k: new[k] for k in same} == {k: run[k] for k in same}
    assert response.headers["location"] == f"/api/workflows/{new['id']}"
    assert _woken(api_redis) == [new["id"]]
    old = api_client.get(f"/api/workflows/{run['id']}").json()
    assert old["status"] == final  # the original stays as it was


@pytest.mark.parametrize("state", [None, WorkflowStatus.RUNNING, WorkflowStatus.COMPLETED])
def test_only_runs_that_ended_unsuccessfully_are_retried(
    api_client: TestClient, api_sessions: sessionmaker[Session], state: WorkflowStatus | None
) -> None:
    run = _start(api_client, "noop_pipeline")
    if state is not None:
        _set_status(api_sessions, run["id"], state)
    response = api_client.post(f"/api/workflows/{run['id']}/retry")
    assert response.status_code == 409
    assert "only FAILED, CANCELLED or TIMED_OUT" in response.json()["detail"]
