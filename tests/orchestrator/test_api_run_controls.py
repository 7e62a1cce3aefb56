"""Controls over runs through the REST API on real Postgres and Redis: idempotent starts, tags
and search, priorities and a definition's queue settings, pausing a run or a queue, and the
claim that honours all of them (a real scheduler's statements, driven by hand)."""

from __future__ import annotations

import json
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient

from orchestrator.contract import keys
from orchestrator.db.scheduler_store import SchedulerStore

pytestmark = pytest.mark.usefixtures("task_worker")


def _start(client: TestClient, workflow: str, **extra: Any) -> dict[str, Any]:
    response = client.post("/api/workflows", json={"workflow": workflow, "input": {}, **extra})
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


def _claim(store: SchedulerStore, limit: int = 50, *, limits: bool = False) -> list[uuid.UUID]:
    return [c.id for c in store.claim(f"s-{uuid.uuid4().hex[:6]}", limit, 60.0, limits=limits)]


# --- idempotent starts ------------------------------------------------------------------


def test_the_same_idempotency_key_and_body_answer_the_same_run(
    api_client: TestClient, flow: str, api_redis: redis.Redis
) -> None:
    key = {"Idempotency-Key": f"order-{uuid.uuid4()}"}
    body = {"workflow": flow, "input": {"data": {"n": 1}}, "tags": ["x"]}
    first = api_client.post("/api/workflows", json=body, headers=key)
    assert first.status_code == 201, first.text
    assert "Idempotent-Replayed" not in first.headers
    api_redis.delete(keys.WAKE)
    again = api_client.post("/api/workflows", json=body, headers=key)
    assert again.status_code == 201, again.text
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json()["id"] == first.json()["id"]
    assert again.headers["Location"] == f"/api/workflows/{first.json()['id']}"
    assert api_redis.llen(keys.WAKE) == 0  # nothing new to claim
    runs = api_client.get("/api/workflows", params={"workflow": flow}).json()
    assert runs["total"] == 1


def test_an_idempotency_key_with_another_body_is_refused_with_why(
    api_client: TestClient, flow: str
) -> None:
    key = {"Idempotency-Key": f"k-{uuid.uuid4()}"}
    first = api_client.post("/api/workflows", json={"workflow": flow, "input": {}}, headers=key)
    assert first.status_code == 201
    other = {"workflow": flow, "input": {"data": {"n": 2}}}
    refused = api_client.post("/api/workflows", json=other, headers=key)
    assert refused.status_code == 422, refused.text
    assert refused.json()["code"] == "idempotency_key_reused"
    assert first.json()["id"] in refused.json()["detail"]
    assert api_client.get("/api/workflows", params={"workflow": flow}).json()["total"] == 1


def test_concurrent_retries_with_one_idempotency_key_start_one_run(
    api_client: TestClient, flow: str
) -> None:
    key = {"Idempotency-Key": f"burst-{uuid.uuid4()}"}
    body = {"workflow": flow, "input": {"data": {"burst": True}}}

    def post(_: int) -> tuple[int, str]:
        reply = api_client.post("/api/workflows", json=body, headers=key)
        return reply.status_code, reply.json()["id"]

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(post, range(16)))
    assert {code for code, _ in answers} == {201}
    assert len({run for _, run in answers}) == 1
    assert api_client.get("/api/workflows", params={"workflow": flow}).json()["total"] == 1


def test_idempotency_keys_are_per_caller(api_client: TestClient, flow: str) -> None:
    """Another key (caller) with the same Idempotency-Key starts a run of its own."""
    made = api_client.post("/api/keys", json={"name": f"op-{uuid.uuid4().hex[:6]}",
                                               "role": "operator"}).json()  # fmt: skip
    key = {"Idempotency-Key": "shared-key-123"}
    body = {"workflow": flow, "input": {}}
    mine = api_client.post("/api/workflows", json=body, headers=key).json()
    theirs = api_client.post(
        "/api/workflows", json=body, headers={**key, "Authorization": f"Bearer {made['key']}"}
    ).json()
    assert mine["id"] != theirs["id"]
    assert theirs["started_by"] == made["name"]


@pytest.mark.parametrize("bad", [b"", b"a b", b"x" * 256, "é".encode()])
def test_a_malformed_idempotency_key_is_a_422(
    api_client: TestClient, flow: str, bad: bytes
) -> None:
    reply = api_client.post(
        "/api/workflows",
        json={"workflow": flow, "input": {}},
        headers={"Idempotency-Key": bad},
    )
    assert reply.status_code == 422, reply.text


# --- tags and search ----------------------------------------------------------------------


def test_runs_are_found_by_tag_input_and_definition_paged(
    api_client: TestClient, flow: str
) -> None:
    a = _start(api_client, flow, tags=["nightly", "team:vision"], input={"data": {"cam": 1}})
    b = _start(api_client, flow, tags=["nightly"], input={"data": {"cam": 2}})
    _start(api_client, flow, input={"data": {"cam": 1, "x": True}})

    def ids(**params: Any) -> list[str]:
        page = api_client.get("/api/workflows", params={"workflow": flow, **params})
        assert page.status_code == 200, page.text
        return [r["id"] for r in page.json()["items"]]

    assert ids(tag="nightly") == [b["id"], a["id"]]  # newest first
    assert ids(tag=["nightly", "team:vision"]) == [a["id"]]
    assert len(ids(input=json.dumps({"data": {"cam": 1}}))) == 2
    assert ids(input=json.dumps({"data": {"cam": 2}})) == [b["id"]]
    assert ids(tag="nightly", limit=1, offset=1) == [a["id"]]
    assert a["tags"] == ["nightly", "team:vision"]


@pytest.mark.parametrize(
    "params",
    [{"input": "not json"}, {"input": "[1, 2]"}, {"tag": "has space"}, {"tag": "x" * 65}],
)
def test_a_bad_search_is_a_422_that_says_why(api_client: TestClient, params: Any) -> None:
    reply = api_client.get("/api/workflows", params=params)
    assert reply.status_code == 422, reply.text


# --- priorities, limits and paused queues in the claim ---------------------------------------


def test_a_claim_takes_the_highest_priority_first_then_the_oldest(
    api_client: TestClient, flow: str, api_store: SchedulerStore
) -> None:
    api_client.post(f"/api/workflow-definitions/{flow}/pause")  # let a backlog build up
    low = [_start(api_client, flow, priority=-5)["id"] for _ in range(2)]
    default = [_start(api_client, flow)["id"] for _ in range(2)]
    high = [_start(api_client, flow, priority=50)["id"] for _ in range(2)]
    assert not {str(i) for i in _claim(api_store)} & {*low, *default, *high}  # paused
    api_client.post(f"/api/workflow-definitions/{flow}/resume")
    claimed = [str(i) for i in _claim(api_store) if str(i) in {*low, *default, *high}]
    assert claimed == [*high, *default, *low]


def test_a_definitions_priority_is_its_runs_default(api_client: TestClient, flow: str) -> None:
    body = {"tasks": [{"ref": "a", "task": "noop"}], "priority": 7}
    saved = api_client.put(f"/api/workflow-definitions/{flow}", json=body)
    assert saved.status_code == 200, saved.text
    assert saved.json()["priority"] == 7
    assert _start(api_client, flow)["priority"] == 7
    assert _start(api_client, flow, priority=-1)["priority"] == -1
    # A PUT that leaves the settings out keeps them; steps alike save no version.
    again = api_client.put(f"/api/workflow-definitions/{flow}", json={"tasks": body["tasks"]})
    assert again.json()["priority"] == 7 and again.json()["version"] == saved.json()["version"]


def test_a_paused_queue_is_not_claimed_until_resumed(
    api_client: TestClient, flow: str, api_store: SchedulerStore, api_redis: redis.Redis
) -> None:
    paused = api_client.post(f"/api/workflow-definitions/{flow}/pause")
    assert paused.status_code == 200 and paused.json()["paused_at"]
    run = _start(api_client, flow)["id"]
    assert run not in {str(i) for i in _claim(api_store)}
    api_redis.delete(keys.WAKE)
    resumed = api_client.post(f"/api/workflow-definitions/{flow}/resume")
    assert resumed.json()["paused_at"] is None
    assert "claim" in api_redis.lrange(keys.WAKE, 0, -1)
    assert run in {str(i) for i in _claim(api_store)}


def test_a_definitions_run_limit_holds_in_the_claim(
    api_client: TestClient, flow: str, api_store: SchedulerStore
) -> None:
    body = {"tasks": [{"ref": "a", "task": "noop"}], "max_concurrent_runs": 2}
    assert api_client.put(f"/api/workflow-definitions/{flow}", json=body).status_code == 200
    runs = {_start(api_client, flow)["id"] for _ in range(5)}
    assert api_store.limits_exist()
    # The plain claim leaves a limited definition's runs to the counting one.
    assert not runs & {str(i) for i in _claim(api_store)}
    first = runs & {str(i) for i in _claim(api_store, limits=True)}
    assert len(first) == 2
    assert not runs & {str(i) for i in _claim(api_store, limits=True)}  # both places taken
    done = sorted(first)[0]
    assert api_client.post(f"/api/workflows/{done}/cancel").status_code == 200
    assert len(runs & {str(i) for i in _claim(api_store, limits=True)}) == 1
    api_client.put(f"/api/workflow-definitions/{flow}", json={**body, "max_concurrent_runs": None})


# --- pausing a run ------------------------------------------------------------------------


def test_pausing_a_run_holds_its_claim_and_says_so(
    api_client: TestClient, flow: str, api_store: SchedulerStore, api_redis: redis.Redis
) -> None:
    run = _start(api_client, flow)["id"]
    api_redis.delete(keys.WAKE)
    paused = api_client.post(f"/api/workflows/{run}/pause")
    assert paused.status_code == 200, paused.text
    assert paused.json()["paused_at"] is not None
    assert api_redis.lrange(keys.WAKE, 0, -1) == [f"pause:{run}"]
    assert api_client.post(f"/api/workflows/{run}/pause").status_code == 200  # again: same
    assert run not in {str(i) for i in _claim(api_store)}
    resumed = api_client.post(f"/api/workflows/{run}/resume")
    assert resumed.json()["paused_at"] is None
    kinds = [e["kind"] for e in api_client.get(f"/api/workflows/{run}").json()["events"]]
    assert kinds.count("workflow.paused") == 1 and kinds.count("workflow.unpaused") == 1
    assert run in {str(i) for i in _claim(api_store)}


def test_a_finished_run_cannot_be_paused(api_client: TestClient, flow: str) -> None:
    run = _start(api_client, flow)["id"]
    assert api_client.post(f"/api/workflows/{run}/cancel").status_code == 200
    refused = api_client.post(f"/api/workflows/{run}/pause")
    assert refused.status_code == 409
    assert "finished" in refused.json()["detail"]
    assert api_client.post(f"/api/workflows/{uuid.uuid4()}/pause").status_code == 404
