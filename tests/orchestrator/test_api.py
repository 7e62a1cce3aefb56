"""The controller's REST API on real Postgres and Redis: start-up, health and docs, task and
workflow definitions, workers, the request size limit. Runs, the API with a service down and
the state layer have modules of their own (``test_api_runs``, ``test_api_services_down``,
``test_claims_and_migrations``)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient
from redis.typing import EncodableT, FieldT
from sqlalchemy.orm import Session, sessionmaker

from cdi.controller.models import ObjectInfo
from orchestrator.contract import keys
from orchestrator.controller import create_app
from orchestrator.controller.api.routes.cdi import channels
from orchestrator.db import repository as repo
from orchestrator.errors import ConfigError
from orchestrator.settings import Settings
from orchestrator.worker.heartbeat import Heartbeat
from tests.orchestrator.api_support import KeyedCalls

# Tasks are registered only when a live worker loaded them.
pytestmark = pytest.mark.usefixtures("task_worker")


def _unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


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
    assert set(checks) == {"postgres", "redis", "minion", "scheduler", "workers", "s3"}
    assert checks["scheduler"]["ok"] is False and "no scheduler" in checks["scheduler"]["detail"]
    assert all(checks[name]["ok"] for name in ("postgres", "redis", "minion", "workers", "s3"))

    api_redis.hset(keys.SCHEDULERS, "scheduler-stalled", f"{time.time() - 60:.3f}")
    stalled = api_client.get("/api/readyz").json()["checks"]["scheduler"]
    assert not stalled["ok"] and "scheduler-stalled" in stalled["detail"]

    api_redis.hset(keys.SCHEDULERS, "scheduler-live", f"{time.time():.3f}")
    ready = api_client.get("/api/readyz")
    assert ready.status_code == 200, ready.text
    assert ready.json()["checks"]["scheduler"] == {"ok": True, "detail": "ok (scheduler-live)"}
    api_redis.delete(keys.SCHEDULERS)


def test_readyz_of_the_api_alone_ignores_schedulers_and_workers(
    api_client: TestClient,
    api_redis: redis.Redis,
    task_worker: Heartbeat,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``scope=api`` (what a load balancer's readiness probe asks): the API answers while
    Postgres and Redis do, with no scheduler and no live worker (workers scaled to zero); an
    anonymous probe learns ready or not only, and an unknown scope is a 422."""
    monkeypatch.delenv("CDI_URL", raising=False)
    api_redis.delete(keys.SCHEDULERS)
    api_redis.delete(keys.WORKERS)
    assert api_client.get("/api/readyz").status_code == 503  # no workflow can run
    alone = api_client.get("/api/readyz", params={"scope": "api"})
    assert alone.status_code == 200, alone.text
    fine = {"ok": True, "detail": "ok"}
    assert alone.json() == {"status": "ok", "checks": {"postgres": fine, "redis": fine}}
    anonymous = KeyedCalls(api_client, None).get("/api/readyz", params={"scope": "api"})
    assert anonymous.status_code == 200 and anonymous.json() == {"status": "ok"}
    wrong = api_client.get("/api/readyz", params={"scope": "everything"})
    assert wrong.status_code == 422 and "scope" in wrong.text
    task_worker.beat()  # the module's worker is live again for the next test, not in 2 s


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


# --- workers -------------------------------------------------------------------------------


def test_workers_from_heartbeats(api_client: TestClient, api_redis: redis.Redis) -> None:
    now = time.time()
    fresh, stale, garbled, gone = (_unique(w) for w in ("fresh", "stale", "garbled", "gone"))
    silent_for = 3.5 * keys.HEARTBEAT_INTERVAL_S  # past the 3-interval limit
    beats: dict[str, dict[FieldT, EncodableT]] = {
        fresh: {"cpu": "97.5", "mem": "40", "queue_depth": "3", "running": "1", "slots": "2",
                "host": "h1", "held_images": "2", "held_bytes": "52428800",
                "last_heartbeat": now - 1, "started_at": now - 60, "proc_cpu": "12.5",
                "proc_rss": "104857600", "proc_mem": "1.3", "input_cache_hits": "9",
                "input_cache_misses": "1", "input_cache_saved_bytes": "18000000",
                "input_cache_s3_bytes": "2000000", "input_cache_holder": "1",
                "input_cache_entries": "1", "input_cache_bytes": "26000000"},
        stale: {"cpu": "1", "host": "h2", "last_heartbeat": now - silent_for,
                "input_cache_hits": "", "input_cache_misses": ""},  # the cache is off
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
    assert listed[fresh]["input_cache"] == {
        "hits": 9, "misses": 1, "saved_bytes": 18000000, "s3_bytes": 2000000, "holder": True,
        "entries": 1, "bytes": 26000000,
    }  # fmt: skip
    assert listed[stale]["input_cache"] is None and listed[gone]["input_cache"] is None
    assert 0.5 < listed[fresh]["heartbeat_age_s"] < 5
    assert listed[stale]["alive"] is False and listed[stale]["host"] == "h2"
    assert listed[garbled]["alive"] is True
    assert (listed[garbled]["cpu"], listed[garbled]["queue_depth"]) == (None, None)
    assert listed[gone]["alive"] is False and listed[gone]["last_heartbeat"] is None


def test_channels_are_found_from_their_objects() -> None:
    def obj(key: str, owner: str, host: str = "h1", size: int = 4096) -> ObjectInfo:
        return ObjectInfo(key, host, size, owner, 1, 10.0, 11.0)

    listed = channels([
        obj("channel/frames", "cam", size=1 << 20),
        obj("channel/frames/reader/det-2", "det-2"),
        obj("channel/frames/reader/det-1", "det-1"),
        obj("channel/frames/reader/far", "far", host="h2"),  # another host's: not this ring's
        obj("channel/left/reader/r", "r"),  # a cursor whose ring is gone: no channel
        obj("channel/frames/other/x", "x"),  # not a channel's key
        obj("wf-1", "worker-1"),
    ])  # fmt: skip
    assert [c.model_dump() for c in listed] == [{
        "name": "frames", "host": "h1", "writer": "cam", "readers": ["det-1", "det-2"],
        "ring_bytes": 1 << 20, "created_at": 10.0,
    }]  # fmt: skip


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
