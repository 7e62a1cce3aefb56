"""Retention: a pass prunes exactly the finished runs each definition's policy lets go, with
everything that names them, archives them to S3 first, deletes their results when the policy
says so; the API's housekeeping runs passes by itself and ``GET /api/retention`` tells."""

from __future__ import annotations

import gzip
import json
import time
import uuid
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from orchestrator.controller import create_app
from orchestrator.db import retention, tallies
from orchestrator.objectstore import ObjectStore
from orchestrator.retention import Pruner
from orchestrator.settings import Settings
from tests.orchestrator.api_support import admin_key_of, keyed_client


@pytest.fixture(scope="module")
def api_settings(api_settings: Settings) -> Settings:
    """The module's app without a retention pass of its own (the tests run theirs)."""
    return api_settings.model_copy(update={"retention_interval_s": 86_400.0})


def _definition(api_client: TestClient, prefix: str, **retention: Any) -> str:
    name = f"{prefix}_{uuid.uuid4().hex[:6]}"
    body = {"name": name, "tasks": [{"ref": "a", "task": "noop"}]}
    assert api_client.post("/api/workflow-definitions", json=body).status_code == 201
    if retention:
        reply = api_client.put(f"/api/workflow-definitions/{name}/retention", json=retention)
        assert reply.status_code == 200, reply.text
        assert reply.json()["retention_days"] == retention.get("days")
    return name


def _run(api_engine: Engine, definition: str, status: str, ended_days_ago: float | None,
         **extra: Any) -> uuid.UUID:  # fmt: skip
    """A run as its end left it, ``ended_days_ago`` (``None``: not ended), with a task run, an
    event and a hand-off (``run_id``: its id, else a new one)."""
    run = extra.get("run_id") or uuid.uuid4()
    with api_engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO workflows (id, definition, definition_version, status, policy, "
                "data_plane, input, output, result_uri, retry_of, created_at, finished_at) "
                "VALUES (:id, :d, 1, CAST(:status AS workflow_status), 'affinity', 'cdi', '{}', "
                "CAST(:output AS jsonb), :result, :retry_of, "
                "now() - make_interval(secs => coalesce(:ago, 0) * 86400 + 5), "
                "now() - make_interval(secs => :ago * 86400))"
            ),
            {"id": run, "d": definition, "status": status, "ago": ended_days_ago,
             "output": json.dumps(extra.get("output")), "result": extra.get("result"),
             "retry_of": extra.get("retry_of")},
        )  # fmt: skip
        task_run = conn.execute(
            text(
                "INSERT INTO task_runs (workflow_id, ref, task, attempt, status, data) "
                "VALUES (:id, 'a', 'noop', 1, 'COMPLETED', CAST(:data AS jsonb)) RETURNING id"
            ),
            {"id": run, "data": json.dumps(extra.get("data"))},
        ).scalar_one()
        conn.execute(
            text("INSERT INTO events (workflow_id, kind) VALUES (:id, 'workflow.created')"),
            {"id": run},
        )
        conn.execute(
            text(
                "INSERT INTO handoffs (workflow_id, task_run_id, from_container, to_container, "
                "bytes, duration_us) VALUES (:id, :t, 'scheduler', 'worker', 10, 1.0)"
            ),
            {"id": run, "t": task_run},
        )
    return run


def _left(api_engine: Engine, ids: list[uuid.UUID]) -> set[uuid.UUID]:
    with api_engine.connect() as conn:
        rows = conn.execute(text("SELECT id FROM workflows WHERE id = ANY(:ids)"), {"ids": ids})
        return {row[0] for row in rows}


def _deliveries(api_engine: Engine, runs: list[uuid.UUID]) -> dict[uuid.UUID, set[str]]:
    """A webhook told of each run's end: one delivery sent, one failed, one still to send;
    the statuses of each run's deliveries."""
    with api_engine.begin() as conn:
        hook = conn.execute(
            text(
                "INSERT INTO webhooks (id, name, url, secret, events) VALUES (gen_random_uuid(), "
                ":name, 'http://127.0.0.1:9/', 's', '{workflow.completed}') RETURNING id"
            ),
            {"name": f"hook_{uuid.uuid4().hex[:8]}"},
        ).scalar_one()
        conn.execute(
            text(
                "INSERT INTO webhook_deliveries (webhook_id, event, workflow_id, payload, status) "
                "SELECT :hook, 'workflow.completed', r, '{}', CAST(s AS delivery_status) "
                "FROM unnest(CAST(:runs AS uuid[])) r, "
                "unnest(ARRAY['DELIVERED', 'FAILED', 'PENDING']) s"
            ),
            {"hook": hook, "runs": runs},
        )
    return _delivery_statuses(api_engine, runs)


def _delivery_statuses(api_engine: Engine, runs: list[uuid.UUID]) -> dict[uuid.UUID, set[str]]:
    with api_engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT workflow_id, status::text FROM webhook_deliveries "
                "WHERE workflow_id = ANY(:runs)"
            ),
            {"runs": runs},
        )
        found: dict[uuid.UUID, set[str]] = {}
        for run, status in rows:
            found.setdefault(run, set()).add(status)
        return found


def _keys(s3: Any, bucket: str, prefix: str) -> list[str]:
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
    return sorted(o["Key"] for o in listed)


def test_a_pass_prunes_exactly_what_each_policy_lets_go_and_archives_it_first(
    api_client: TestClient, api_settings: Settings, api_engine: Engine, s3: Any
) -> None:
    bucket = api_settings.s3_bucket
    archive = f"s3://{bucket}/archive-{uuid.uuid4().hex[:6]}/"
    settings = api_settings.model_copy(update={"archive_uri": archive})
    default = _definition(api_client, "keep30")  # the default: 30 days, results kept
    week = _definition(api_client, "week", days=7, results="delete")
    forever = _definition(api_client, "forever", days=0)

    def stored(run: uuid.UUID, name: str) -> str:
        key = f"results/{run}{name}"
        s3.put_object(Bucket=bucket, Key=key, Body=b"x")
        return f"s3://{bucket}/{key}"

    old_default = _run(api_engine, default, "COMPLETED", 40)
    young_default = _run(api_engine, default, "FAILED", 20)
    retry = _run(api_engine, default, "COMPLETED", 1, retry_of=old_default)
    week_ids = [uuid.uuid4() for _ in range(2)]
    image, named = stored(week_ids[0], ".png"), stored(week_ids[0], "/a.values.npy")
    foreign = stored(uuid.uuid4(), ".png")  # another run's, named in this one's output
    old_week = [
        _run(api_engine, week, "COMPLETED", 8, run_id=week_ids[0], result=image,
             output={"results": {"a.values": named, "other": foreign}},
             data={"results": {"values": named}}),
        _run(api_engine, week, "CANCELLED", 12, run_id=week_ids[1]),
        _run(api_engine, week, "TIMED_OUT", 9),
    ]  # fmt: skip
    kept_image = stored(old_default, ".png")  # the default keeps results
    with api_engine.begin() as conn:
        conn.execute(text("UPDATE workflows SET result_uri = :r WHERE id = :id"),
                     {"r": kept_image, "id": old_default})  # fmt: skip
    young_week = _run(api_engine, week, "COMPLETED", 3)
    running = _run(api_engine, week, "RUNNING", None)  # started 5 s ago, never ended
    ancient_forever = _run(api_engine, forever, "COMPLETED", 400)
    everyone = [old_default, young_default, retry, *old_week, young_week, running,
                ancient_forever]  # fmt: skip
    pruned = {old_default, *old_week}
    told = [old_week[0], young_week]
    assert _deliveries(api_engine, told) == {r: {"DELIVERED", "FAILED", "PENDING"} for r in told}

    report = Pruner(api_engine, settings, store=ObjectStore(settings, enforce=True)).run_pass()
    assert report.error is None, report.error
    assert report.pruned >= len(pruned)  # also what earlier tests left ending long ago
    assert _left(api_engine, everyone) == set(everyone) - pruned
    with api_engine.connect() as conn:
        for table in ("task_runs", "events", "handoffs"):
            orphans = conn.scalar(
                text(f"SELECT count(*) FROM {table} WHERE workflow_id = ANY(:ids)"),
                {"ids": list(pruned)},
            )
            assert orphans == 0, table
        assert conn.scalar(text("SELECT retry_of FROM workflows WHERE id = :id"),
                           {"id": retry}) is None  # fmt: skip
        counts = tallies.counts(conn, "")
        on_record = conn.scalar(text("SELECT count(*) FROM workflows"))
        state = conn.execute(text("SELECT pass_pruned, error FROM retention_state")).one()
    assert sum(n for s, n in counts.items() if s.startswith("workflows:")) == on_record
    assert counts["pruned"] >= len(pruned) and counts["archived"] == counts["pruned"]
    assert tuple(state) == (report.pruned, None)
    # A pruned run's deliveries go with it, but for the one still to send; a kept run's stay.
    assert _delivery_statuses(api_engine, told) == {
        old_week[0]: {"PENDING"},
        young_week: {"DELIVERED", "FAILED", "PENDING"},
    }

    # Archived first: one line per pruned run, as stored, with its task runs and events.
    lines = []
    for key in _keys(s3, bucket, archive.removeprefix(f"s3://{bucket}/")):
        assert key.endswith(".jsonl.gz")
        body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        lines += [json.loads(line) for line in gzip.decompress(body).decode().splitlines()]
    archived = {uuid.UUID(line["workflow"]["id"]): line for line in lines}
    assert len(archived) == len(lines) and pruned <= set(archived)
    first = archived[old_week[0]]
    assert first["workflow"]["result_uri"] == image
    assert [t["ref"] for t in first["task_runs"]] == ["a"]
    assert [e["kind"] for e in first["events"]] == ["workflow.created"]
    assert sorted(d["status"] for d in first["deliveries"]) == ["DELIVERED", "FAILED", "PENDING"]
    assert len(first["handoffs"]) == 1

    # Results: deleted where the policy says so, and only the run's own.
    left = set(_keys(s3, bucket, "results/"))
    assert image.removeprefix(f"s3://{bucket}/") not in left
    assert named.removeprefix(f"s3://{bucket}/") not in left
    assert foreign.removeprefix(f"s3://{bucket}/") in left
    assert kept_image.removeprefix(f"s3://{bucket}/") in left
    again = Pruner(api_engine, settings).run_pass()
    assert (again.pruned, again.error) == (0, None)


def test_the_api_prunes_by_itself_and_says_what_it_did(
    api_app: FastAPI, api_client: TestClient, api_settings: Settings, api_engine: Engine
) -> None:
    brief = _definition(api_client, "brief", days=1)
    old = [_run(api_engine, brief, "COMPLETED", 2) for _ in range(3)]
    young = _run(api_engine, brief, "COMPLETED", 0.5)
    quick = create_app(api_settings.model_copy(update={"retention_interval_s": 0.3}))
    with keyed_client(quick, admin_key_of(api_settings)) as client:
        deadline = time.monotonic() + 60
        while _left(api_engine, old) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _left(api_engine, [*old, young]) == {young}
        shown = client.get("/api/retention").json()
    assert shown["default_days"] == 30 and shown["default_results"] == "keep"
    mine = [d for d in shown["definitions"] if d["name"] == brief]
    assert mine == [{"name": brief, "days": 1, "results": None, "effective_days": 1,
                     "effective_results": "keep"}]  # fmt: skip
    assert shown["pruned_total"] >= 3 and shown["last_pass"]["error"] is None
    with api_engine.connect() as conn:
        assert shown["runs_on_record"] <= conn.scalar(text("SELECT count(*) FROM workflows"))


def test_a_definitions_retention_is_checked_and_back_to_the_default_with_nulls(
    api_client: TestClient,
) -> None:
    name = _definition(api_client, "policy", days=3, results="delete")
    shown = api_client.get(f"/api/workflow-definitions/{name}").json()
    assert (shown["retention_days"], shown["retention_results"]) == (3, "delete")
    assert shown["version"] == 1  # a policy is no new version
    put = api_client.put
    assert put(f"/api/workflow-definitions/{name}/retention", json={"days": -1}).status_code == 422
    assert put(f"/api/workflow-definitions/{name}/retention",
               json={"results": "shred"}).status_code == 422  # fmt: skip
    assert put("/api/workflow-definitions/nope/retention", json={}).status_code == 404
    reset = put(f"/api/workflow-definitions/{name}/retention", json={}).json()
    assert (reset["retention_days"], reset["retention_results"]) == (None, None)
    assert reset["updated_at"] == shown["updated_at"]


def test_a_pass_leaves_the_pruning_to_the_replica_that_holds_it(
    api_client: TestClient, api_settings: Settings, api_engine: Engine
) -> None:
    other = _definition(api_client, "other", days=1)
    old = _run(api_engine, other, "COMPLETED", 3)
    state = text("SELECT pass_at, pass_pruned FROM retention_state")
    with api_engine.connect() as holder:  # another API replica, in the middle of a batch
        holder.execute(text("SELECT pg_advisory_lock(:key)"), {"key": retention.LOCK})
        with api_engine.connect() as conn:
            before = conn.execute(state).all()
        report = Pruner(api_engine, api_settings).run_pass()
        assert (report.pruned, report.error) == (0, None)
        assert _left(api_engine, [old]) == {old}
        with api_engine.connect() as conn:
            assert conn.execute(state).all() == before  # its pass, its record
        holder.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": retention.LOCK})
        holder.commit()
    assert Pruner(api_engine, api_settings).run_pass().pruned >= 1
    assert _left(api_engine, [old]) == set()


def test_between_batches_a_pass_waits_for_runs_going_yet_moves_on(
    api_client: TestClient, api_settings: Settings, api_engine: Engine
) -> None:
    busy = _definition(api_client, "busy", days=1)
    going = _run(api_engine, busy, "RUNNING", None)  # never ends here: no scheduler
    old = [_run(api_engine, busy, "COMPLETED", 3) for _ in range(3)]
    report = Pruner(api_engine, api_settings, batch=1, quiet_wait_s=0.2).run_pass()
    assert report.error is None and report.pruned >= 3
    assert _left(api_engine, [*old, going]) == {going}
    # Before each batch after the first, the whole wait: a run was going all along.
    assert report.yielded_s >= 2 * 0.2
