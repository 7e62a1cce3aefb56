"""The REST API while a service it needs is down or drops its connections: it says so, and
answers again without a restart."""

from __future__ import annotations

import asyncio
import functools
import io
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from PIL import Image
from sqlalchemy import make_url

from orchestrator.child_process import free_port
from orchestrator.contract.vocabulary import DataPlane, Policy
from orchestrator.controller import create_app
from orchestrator.db import async_run_store
from orchestrator.settings import Settings
from tests.orchestrator.api_support import admin_key_of, keyed_client

# Tasks are registered only when a live worker loaded them.
pytestmark = pytest.mark.usefixtures("task_worker")

IMAGE = {"image": "s3://cdiflow/images/cat.png"}


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


def test_s3_down_is_a_503_from_the_routes_that_reach_it(api_settings: Settings) -> None:
    """An upload while S3 does not answer says so (503, naming the outage), not a 500."""
    dead = api_settings.model_copy(update={"s3_endpoint_url": f"http://127.0.0.1:{free_port()}"})
    png = io.BytesIO()
    Image.new("RGB", (4, 4), (10, 200, 30)).save(png, "PNG")
    with keyed_client(create_app(dead), admin_key_of(dead)) as client:
        upload = client.post("/api/inputs", files={"file": ("in.png", png.getvalue())})
    assert upload.status_code == 503, upload.text
    assert upload.json()["code"] == "storage_unavailable"
    assert "S3 did not answer" in upload.json()["detail"]


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
