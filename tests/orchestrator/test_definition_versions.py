"""Workflow definitions change: versions, a run's own version, delete, and task updates,
through the real API on real Postgres and Redis."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from fastapi.testclient import TestClient

# Tasks are registered only when a live worker loaded them.
pytestmark = pytest.mark.usefixtures("task_worker")

CHAIN: list[dict[str, Any]] = [
    {"ref": "deblur", "task": "deblur"},
    {"ref": "classify", "task": "classify", "depends_on": ["deblur"]},
]


def _name() -> str:
    return f"flow_{uuid.uuid4().hex[:8]}"


def _start(api: TestClient, name: str, **extra: Any) -> Any:
    reply = api.post("/api/workflows", json={"workflow": name, "input": {}, **extra})
    return reply


def test_saving_a_definition_makes_a_new_version_and_keeps_the_old_ones(
    api_client: TestClient,
) -> None:
    name = _name()
    created = api_client.put(f"/api/workflow-definitions/{name}", json={"tasks": CHAIN[:1]})
    assert created.status_code == 201, created.text
    assert created.json()["version"] == 1
    assert created.headers["location"] == f"/api/workflow-definitions/{name}"

    same = api_client.put(f"/api/workflow-definitions/{name}", json={"tasks": CHAIN[:1]})
    assert same.status_code == 200 and same.json()["version"] == 1  # nothing changed

    changed = api_client.put(
        f"/api/workflow-definitions/{name}", json={"tasks": CHAIN, "description": "two steps"}
    )
    assert changed.status_code == 200 and changed.json()["version"] == 2
    current = api_client.get(f"/api/workflow-definitions/{name}").json()
    assert current["version"] == 2 and [t["ref"] for t in current["tasks"]] == [
        "deblur",
        "classify",
    ]

    versions = api_client.get(f"/api/workflow-definitions/{name}/versions").json()
    assert [(v["version"], len(v["tasks"])) for v in versions] == [(2, 2), (1, 1)]
    first = api_client.get(f"/api/workflow-definitions/{name}/versions/1").json()
    assert [t["ref"] for t in first["tasks"]] == ["deblur"] and first["description"] == ""
    missing = api_client.get(f"/api/workflow-definitions/{name}/versions/7")
    assert missing.status_code == 404 and missing.json()["known"] == ["1", "2"]


def test_post_on_a_taken_name_points_at_put_and_put_checks_the_body(
    api_client: TestClient,
) -> None:
    name = _name()
    assert (
        api_client.post(
            "/api/workflow-definitions", json={"name": name, "tasks": CHAIN}
        ).status_code
        == 201
    )
    again = api_client.post("/api/workflow-definitions", json={"name": name, "tasks": CHAIN})
    assert again.status_code == 409 and f"PUT /api/workflow-definitions/{name}" in again.text

    other = api_client.put(f"/api/workflow-definitions/{name}", json={"name": "x", "tasks": CHAIN})
    assert other.status_code == 422 and "the body names workflow 'x'" in other.text
    bad = api_client.put(
        f"/api/workflow-definitions/{name}", json={"tasks": [{"ref": "a", "task": "nope"}]}
    )
    assert bad.status_code == 422 and "nope" in bad.text
    assert api_client.get(f"/api/workflow-definitions/{name}").json()["version"] == 1


def test_a_run_records_its_version_and_may_ask_for_an_older_one(api_client: TestClient) -> None:
    name = _name()
    api_client.put(f"/api/workflow-definitions/{name}", json={"tasks": CHAIN[:1]})
    api_client.put(f"/api/workflow-definitions/{name}", json={"tasks": CHAIN})
    assert _start(api_client, name).json()["workflow_version"] == 2
    older = _start(api_client, name, version=1)
    assert older.status_code == 201 and older.json()["workflow_version"] == 1
    detail = api_client.get(f"/api/workflows/{older.json()['id']}").json()
    assert detail["workflow_version"] == 1
    unknown = _start(api_client, name, version=9)
    assert unknown.status_code == 404, unknown.text
    assert unknown.json()["known"] == ["1", "2"] and "version 9" in unknown.json()["detail"]


def test_delete_is_refused_while_runs_use_the_definition(api_client: TestClient) -> None:
    name = _name()
    api_client.put(f"/api/workflow-definitions/{name}", json={"tasks": CHAIN})
    run = _start(api_client, name).json()  # PENDING: no scheduler runs in these tests
    refused = api_client.delete(f"/api/workflow-definitions/{name}")
    assert refused.status_code == 409, refused.text
    assert "1 pending or running run(s) (version(s) 1)" in refused.json()["detail"]

    assert api_client.post(f"/api/workflows/{run['id']}/cancel").status_code == 200
    assert api_client.delete(f"/api/workflow-definitions/{name}").status_code == 204
    assert api_client.get(f"/api/workflow-definitions/{name}").status_code == 404
    names = [d["name"] for d in api_client.get("/api/workflow-definitions").json()]
    assert name not in names
    gone = _start(api_client, name)
    assert gone.status_code == 404 and name not in gone.json().get("known", [])
    # The run on record still shows what it ran; it cannot be retried on a deleted definition.
    assert api_client.get(f"/api/workflow-definitions/{name}/versions/1").status_code == 200
    retry = api_client.post(f"/api/workflows/{run['id']}/retry")
    assert retry.status_code == 409 and "deleted" in retry.json()["detail"]
    assert api_client.delete(f"/api/workflow-definitions/{name}").status_code == 404

    # The name can be created again; its versions go on.
    again = api_client.post("/api/workflow-definitions", json={"name": name, "tasks": CHAIN[:1]})
    assert again.status_code == 201 and again.json()["version"] == 2


def test_a_retry_runs_the_version_of_the_run_it_repeats(api_client: TestClient) -> None:
    name = _name()
    api_client.put(f"/api/workflow-definitions/{name}", json={"tasks": CHAIN[:1]})
    run = _start(api_client, name).json()
    api_client.post(f"/api/workflows/{run['id']}/cancel")
    api_client.put(f"/api/workflow-definitions/{name}", json={"tasks": CHAIN})
    retried = api_client.post(f"/api/workflows/{run['id']}/retry")
    assert retried.status_code == 201 and retried.json()["workflow_version"] == 1
    api_client.post(f"/api/workflows/{retried.json()['id']}/cancel")


def test_a_task_definition_can_be_replaced_with_put(api_client: TestClient) -> None:
    name = f"task_{uuid.uuid4().hex[:8]}"
    body = {"name": name, "module": "workflows.image_tasks:deblur", "timeout_s": 5}
    created = api_client.put(f"/api/tasks/{name}", json=body)
    assert created.status_code == 201 and created.json()["timeout_s"] == 5
    replaced = api_client.put(f"/api/tasks/{name}", json={**body, "timeout_s": 9, "retries": 2})
    assert replaced.status_code == 200, replaced.text
    assert (replaced.json()["timeout_s"], replaced.json()["retries"]) == (9, 2)
    assert api_client.get(f"/api/tasks/{name}").json()["timeout_s"] == 9
    mismatch = api_client.put(f"/api/tasks/{name}", json={**body, "name": "other"})
    assert mismatch.status_code == 422
    taken = api_client.post("/api/tasks", json=body)
    assert taken.status_code == 409 and f"PUT /api/tasks/{name}" in taken.text
