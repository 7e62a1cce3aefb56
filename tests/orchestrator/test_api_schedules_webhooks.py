"""Schedules and webhooks through the REST API on real Postgres and Redis, with the schedulers'
statements that fire schedules and the deliverer that sends webhooks, driven by hand: each
tick once however many schedulers look, the catch-up policies, and a delivery to a real local
HTTP receiver whose signature verifies and which is retried after the receiver fails."""

from __future__ import annotations

import itertools
import json
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session, sessionmaker
from standardwebhooks.webhooks import Webhook as Verifier

from orchestrator.contract import keys
from orchestrator.db.engine import make_engine
from orchestrator.db.schedule_store import ScheduleStore
from orchestrator.db.scheduler_store import SchedulerStore
from orchestrator.notify.deliverer import Deliverer

pytestmark = pytest.mark.usefixtures("task_worker")


def _schedule(client: TestClient, workflow: str, **extra: Any) -> dict[str, Any]:
    body = {"name": f"s-{uuid.uuid4().hex[:8]}", "workflow": workflow, "cron": "* * * * * *"}
    reply = client.post("/api/schedules", json={**body, **extra})
    assert reply.status_code == 201, reply.text
    made: dict[str, Any] = reply.json()
    return made


def _ticks(sessions: sessionmaker[Session], schedule_id: str) -> list[datetime]:
    with sessions() as session:
        rows = session.execute(
            text("SELECT scheduled_for FROM workflows WHERE schedule_id = :s ORDER BY 1"),
            {"s": uuid.UUID(schedule_id)},
        )
        return [r[0] for r in rows]


def _backdate(sessions: sessionmaker[Session], schedule_id: str, seconds: float) -> datetime:
    """Move the schedule's next tick ``seconds`` into the past (as if no scheduler had run
    since): the tick it now names."""
    with sessions() as session:
        first: datetime = session.execute(
            text(
                "UPDATE schedules SET next_fire_at = date_trunc('second', now()) - "
                "make_interval(secs => :s) WHERE id = :id RETURNING next_fire_at"
            ),
            {"s": seconds, "id": uuid.UUID(schedule_id)},
        ).scalar_one()
        session.commit()
        return first


@pytest.fixture
def schedule_stores(api_database_url: str, api_client: TestClient) -> Iterator[list[ScheduleStore]]:
    """Two schedulers' schedule statements, each on a connection of its own."""
    engines: list[Engine] = [make_engine(api_database_url) for _ in range(2)]
    stores = [SchedulerStore(e) for e in engines]
    yield [ScheduleStore(s) for s in stores]
    for store, engine in zip(stores, engines, strict=True):
        store.close()
        engine.dispose()


# --- schedules ------------------------------------------------------------------------------


def test_a_schedule_shows_its_next_fire_times(api_client: TestClient, flow: str) -> None:
    made = _schedule(api_client, flow, cron="0 9 * * *", timezone="Europe/Paris")
    times = [datetime.fromisoformat(t) for t in made["next_fire_times"]]
    assert len(times) == 5 and times == sorted(times)
    assert all(t.astimezone().tzinfo is not None for t in times)
    # 09:00 in Paris is 07:00 or 08:00 UTC, whatever the season.
    assert {t.utctimetuple().tm_hour for t in times} <= {7, 8}
    listed = api_client.get("/api/schedules", params={"workflow": flow}).json()
    assert [s["name"] for s in listed] == [made["name"]]
    assert api_client.get(f"/api/schedules/{made['name']}").json()["cron"] == "0 9 * * *"


@pytest.mark.parametrize(
    ("change", "status", "says"),
    [
        ({"cron": "61 * * * *"}, 422, "not a cron expression"),
        ({"cron": "* * *"}, 422, "five fields"),
        ({"cron": "0 0 31 2 *"}, 422, "never fires"),
        ({"timezone": "Mars/Olympus"}, 422, "time zone"),
        ({"workflow": "no_such_flow"}, 404, "not found"),
        ({"catchup": "sometimes"}, 422, "catchup"),
        ({"grace_s": 0}, 422, "grace_s"),
    ],
)
def test_a_bad_schedule_is_refused_with_why(
    api_client: TestClient, flow: str, change: dict[str, Any], status: int, says: str
) -> None:
    body = {"name": f"bad-{uuid.uuid4().hex[:6]}", "workflow": flow, "cron": "* * * * *"}
    reply = api_client.post("/api/schedules", json={**body, **change})
    assert reply.status_code == status, reply.text
    assert says in reply.text


def test_a_schedule_name_is_taken_once(api_client: TestClient, flow: str) -> None:
    made = _schedule(api_client, flow)
    again = api_client.post(
        "/api/schedules", json={"name": made["name"], "workflow": flow, "cron": "@daily"}
    )
    assert again.status_code == 409
    assert api_client.delete(f"/api/schedules/{made['name']}").status_code == 204
    assert api_client.get(f"/api/schedules/{made['name']}").status_code == 404


def test_two_schedulers_make_one_run_per_tick(
    api_client: TestClient,
    flow: str,
    api_sessions: sessionmaker[Session],
    schedule_stores: list[ScheduleStore],
) -> None:
    made = _schedule(api_client, flow, catchup="all")
    first = _backdate(api_sessions, made["id"], 20)
    with ThreadPoolExecutor(2) as pool:
        for _ in range(3):  # both look at once, three times
            list(pool.map(lambda store: store.fire_due(), schedule_stores))
    ticks = _ticks(api_sessions, made["id"])
    assert ticks[0] == first
    assert len(ticks) == len(set(ticks)) >= 21
    assert all((b - a).total_seconds() == 1 for a, b in itertools.pairwise(ticks))
    shown = api_client.get(f"/api/schedules/{made['name']}").json()
    assert datetime.fromisoformat(shown["last_fired_at"]) == ticks[-1]
    assert datetime.fromisoformat(shown["next_fire_at"]) > ticks[-1]
    runs = api_client.get("/api/workflows", params={"schedule": made["name"], "limit": 200})
    assert runs.json()["total"] == len(ticks)
    assert runs.json()["items"][0]["scheduled_for"] is not None


@pytest.mark.parametrize("catchup", ["skip", "latest", "all"])
def test_missed_ticks_follow_the_catch_up_policy(
    api_client: TestClient,
    flow: str,
    api_sessions: sessionmaker[Session],
    schedule_stores: list[ScheduleStore],
    catchup: str,
) -> None:
    made = _schedule(api_client, flow, catchup=catchup, grace_s=3)
    first = _backdate(api_sessions, made["id"], 30)  # 30 ticks were missed
    schedule_stores[0].fire_due()
    ticks = _ticks(api_sessions, made["id"])
    if catchup == "all":
        assert ticks[0] == first and len(ticks) >= 31
    elif catchup == "latest":
        assert len(ticks) == 1 and (ticks[0] - first).total_seconds() >= 30
    else:  # only the ticks within the grace
        assert 1 <= len(ticks) <= 4 and (ticks[0] - first).total_seconds() >= 27
    schedule_stores[0].fire_due()
    assert len(_ticks(api_sessions, made["id"])) - len(ticks) <= 2  # on time from now on


def test_a_paused_schedule_fires_nothing_and_resumes_without_catching_up(
    api_client: TestClient,
    flow: str,
    api_sessions: sessionmaker[Session],
    schedule_stores: list[ScheduleStore],
    api_redis: redis.Redis,
) -> None:
    made = _schedule(api_client, flow, catchup="all", paused=True)
    assert made["paused_at"] is not None
    _backdate(api_sessions, made["id"], 10)
    schedule_stores[0].fire_due()
    assert _ticks(api_sessions, made["id"]) == []
    api_redis.delete(keys.WAKE)
    resumed = api_client.post(f"/api/schedules/{made['name']}/resume").json()
    assert resumed["paused_at"] is None
    assert api_redis.lrange(keys.WAKE, 0, -1) == ["schedules"]
    schedule_stores[0].fire_due()
    assert len(_ticks(api_sessions, made["id"])) <= 1  # the paused ticks are not caught up
    assert api_client.post(f"/api/schedules/{made['name']}/pause").json()["paused_at"]


def test_a_deleted_definition_makes_no_run_and_the_schedule_says_why(
    api_client: TestClient,
    flow: str,
    api_sessions: sessionmaker[Session],
    schedule_stores: list[ScheduleStore],
) -> None:
    made = _schedule(api_client, flow)
    assert api_client.delete(f"/api/workflow-definitions/{flow}").status_code == 204
    _backdate(api_sessions, made["id"], 1)
    schedule_stores[0].fire_due()
    assert _ticks(api_sessions, made["id"]) == []
    shown = api_client.get(f"/api/schedules/{made['name']}").json()
    assert "is deleted" in shown["last_error"]


# --- webhooks -------------------------------------------------------------------------------


class Receiver:
    """A real HTTP server on 127.0.0.1 that records what it is sent and answers ``codes`` in
    turn (then 200)."""

    def __init__(self, codes: list[int]) -> None:
        self.codes = list(codes)
        self.got: list[tuple[dict[str, str], bytes, float]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                receiver.got.append((dict(self.headers), body, time.monotonic()))
                code = receiver.codes.pop(0) if receiver.codes else 200
                self.send_response(code)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook?token=t0k"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_webhook_secret_is_shown_once_and_bad_ones_are_refused(api_client: TestClient) -> None:
    body = {"name": f"h-{uuid.uuid4().hex[:6]}", "url": "https://example.test/hook"}
    made = api_client.post("/api/webhooks", json=body)
    assert made.status_code == 201, made.text
    assert made.json()["secret"].startswith("whsec_")
    assert made.json()["events"] == [
        "workflow.completed",
        "workflow.failed",
        "workflow.cancelled",
        "workflow.timed_out",
    ]
    shown = api_client.get(f"/api/webhooks/{body['name']}").json()
    assert "secret" not in shown and made.json()["secret"] not in json.dumps(
        api_client.get("/api/webhooks").json()
    )
    for bad in (
        {"url": "ftp://x/y"},
        {"url": "https://user:pw@x/y"},
        {"url": "http:///nohost"},
        {"events": ["workflow.exploded"]},
        {"secret": "not-a-secret"},
        {"secret": "whsec_c2hvcnQ="},
    ):
        reply = api_client.post("/api/webhooks", json={**body, "name": "x" + body["name"], **bad})
        assert reply.status_code == 422, (bad, reply.text)
        assert "not-a-secret" not in reply.text


def test_a_run_end_is_delivered_signed_and_retried_after_the_receiver_fails(
    api_client: TestClient, flow: str, api_database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    receiver = Receiver([500, 503])  # fails twice, then takes it
    engine = make_engine(api_database_url)
    deliverer = Deliverer(engine)
    try:
        hook = api_client.post(
            "/api/webhooks",
            json={"name": f"h-{uuid.uuid4().hex[:6]}", "url": receiver.url, "workflow": flow},
        ).json()
        run = api_client.post("/api/workflows", json={"workflow": flow, "input": {}}).json()
        assert api_client.post(f"/api/workflows/{run['id']}/cancel").status_code == 200
        deadline = time.monotonic() + 30
        while len(receiver.got) < 3 and time.monotonic() < deadline:
            deliverer.turn()
            time.sleep(0.2)
        assert len(receiver.got) == 3, receiver.got
        # Retried with backoff: ~1 s, then ~2 s.
        gaps = [b[2] - a[2] for a, b in itertools.pairwise(receiver.got)]
        assert gaps[0] >= 0.9 and gaps[1] >= 1.9, gaps
        headers, body, _ = receiver.got[-1]
        payload = Verifier(hook["secret"]).verify(body, headers)  # the reference verifier
        assert payload["type"] == "workflow.cancelled"
        assert payload["data"]["workflow_id"] == run["id"]
        assert payload["data"]["status"] == "CANCELLED"
        assert {h["webhook-id"] for h, _, _ in receiver.got} == {headers["webhook-id"]}
        with pytest.raises(Exception, match="signature"):  # another secret does not verify
            Verifier("whsec_" + "A" * 43 + "=").verify(body, headers)
        log = api_client.get(f"/api/webhooks/{hook['name']}/deliveries").json()
        assert log["total"] == 1
        (delivery,) = log["items"]
        assert delivery["status"] == "DELIVERED" and delivery["attempts"] == 3
        assert delivery["last_status"] == 200 and delivery["event"] == "workflow.cancelled"
        assert hook["secret"] not in caplog.text and "t0k" not in caplog.text
    finally:
        deliverer.stop()
        engine.dispose()
        receiver.close()


def test_a_webhook_of_another_definition_gets_nothing(
    api_client: TestClient, flow: str, api_database_url: str
) -> None:
    other = f"other_{uuid.uuid4().hex[:6]}"
    steps = {"name": other, "tasks": [{"ref": "a", "task": "noop"}]}
    assert api_client.post("/api/workflow-definitions", json=steps).status_code == 201
    hook = api_client.post(
        "/api/webhooks",
        json={
            "name": f"h-{uuid.uuid4().hex[:6]}",
            "url": "http://127.0.0.1:9/x",
            "workflow": other,
        },
    ).json()
    run = api_client.post("/api/workflows", json={"workflow": flow, "input": {}}).json()
    assert api_client.post(f"/api/workflows/{run['id']}/cancel").status_code == 200
    assert api_client.get(f"/api/webhooks/{hook['name']}/deliveries").json()["total"] == 0
