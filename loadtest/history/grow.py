"""The history the benchmark measures against: real runs first, then their rows cloned.

``run_templates`` runs a few hundred real workflows on the stack (completed under every
policy, failed on a missing input, cancelled), in the shares the issue measured
(86 % completed, 10 % failed, 4 % cancelled), tagged ``bench`` and 20 % of them ``nightly``, 2 %
``rare``. ``History.grow_to`` clones those runs, with their task runs, events and hand-offs,
with set-based SQL (``INSERT … SELECT`` over ``generate_series``, 100,000 runs a transaction),
each clone shifted in time so that the history spreads evenly over the last ``spread_days``
(a year by default); one clone in ten is made by a schedule (``bench_hourly``), and each
clone's end was told to a webhook (``bench_hook``: one delivery a run, 2 % of them FAILED).
The rows go through the same tables, indexes and triggers as real ones.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final

import httpx
import psycopg
from sqlalchemy.engine import make_url

from orchestrator.db import make_engine, tallies
from workflows.samples import bundled_samples

__all__ = [
    "HOOK",
    "SCHEDULE",
    "SPREAD_DAYS",
    "History",
    "Proportions",
    "connect",
    "run_templates",
]

SPREAD_DAYS: Final = 365
SCHEDULE: Final = "bench_hourly"  # made one clone in ten
HOOK: Final = "bench_hook"  # told of every clone's end
CHUNK: Final = 100_000  # runs cloned per transaction
# Of every 50 clones: 43 completed, 5 failed, 2 cancelled (86 / 10 / 4 %).
_SHARES: Final = ((43, "COMPLETED"), (48, "FAILED"), (50, "CANCELLED"))
_WAIT_S: Final = 55.0
_FIVE_STEPS: Final[dict[str, Any]] = {
    "name": "bench_five_steps",
    "tasks": [
        {"ref": "deblur", "task": "deblur"},
        {"ref": "denoise", "task": "denoise", "depends_on": ["deblur"]},
        {"ref": "deblur_again", "task": "deblur", "depends_on": ["denoise"]},
        {"ref": "denoise_again", "task": "denoise", "depends_on": ["deblur_again"]},
        {"ref": "classify", "task": "classify", "depends_on": ["denoise_again"]},
    ],
}


def connect(database_url: str, *, autocommit: bool = False) -> psycopg.Connection[Any]:
    """A psycopg connection from the stack's SQLAlchemy URL."""
    url = make_url(database_url).set(drivername="postgresql")
    return psycopg.connect(url.render_as_string(hide_password=False), autocommit=autocommit)


@dataclass(frozen=True)
class Proportions:
    """What the history holds: per workflow, its task runs, events and hand-offs."""

    workflows: int
    task_runs: float
    events: float
    handoffs: float
    statuses: dict[str, float]  # share of the workflows

    def as_dict(self) -> dict[str, Any]:
        return {
            "workflows": self.workflows,
            "task_runs_per_workflow": round(self.task_runs, 2),
            "events_per_workflow": round(self.events, 2),
            "handoffs_per_workflow": round(self.handoffs, 2),
            "statuses": {k: round(v, 3) for k, v in self.statuses.items()},
        }


def run_templates(
    http: httpx.Client, s3: Any, bucket: str, count: int, *, parallel: int = 6
) -> list[uuid.UUID]:
    """Run ``count`` real workflows to the end and return their ids: of every 50, 20 image
    pipelines under ``affinity``, 13 under ``transfer`` and 10 five-step pipelines (completed),
    5 on an input that does not exist (failed) and 2 cancelled at once. Cloned, that mix holds
    per workflow the 3.16 task runs, 6.16 events and 1.04 hand-offs of the issue's history.
    Then the schedule (``SCHEDULE``) and the webhook (``HOOK``) that the clones name."""
    inputs = []
    for name, path in sorted(bundled_samples().items()):
        key = f"bench-history/{name}"
        s3.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())
        inputs.append(f"s3://{bucket}/{key}")
    missing = f"s3://{bucket}/bench-history/missing.jpg"
    if http.get(f"/api/workflow-definitions/{_FIVE_STEPS['name']}").status_code == 404:
        http.post("/api/workflow-definitions", json=_FIVE_STEPS).raise_for_status()

    def one(i: int) -> uuid.UUID:
        slot = i % 50
        image = inputs[i % len(inputs)]
        # 'nightly' on a fifth; 'rare' on one completed and one failed run in a hundred.
        rare = i % 100 in (7, 45)
        tags = ["bench", *(["nightly"] if i % 5 == 0 else []), *(["rare"] if rare else [])]
        body: dict[str, Any] = {"workflow": "image_pipeline", "input": {"image": image},
                                "tags": tags}  # fmt: skip
        if slot < 20:
            body["policy"] = "affinity"
        elif slot < 33:
            body["policy"] = "transfer"
        elif slot < 43:
            body |= {"workflow": _FIVE_STEPS["name"], "policy": "affinity"}
        elif slot < 48:
            body["input"] = {"image": missing}
        else:
            started = http.post("/api/workflows", json=body).raise_for_status().json()
            http.post(f"/api/workflows/{started['id']}/cancel")  # 409 if it ended first
            return _wait(http, str(started["id"]))
        reply = http.post("/api/workflows", params={"wait_s": _WAIT_S}, json=body,
                          timeout=_WAIT_S + 30)  # fmt: skip
        run = reply.raise_for_status().json()
        return _wait(http, str(run["id"]))

    with ThreadPoolExecutor(parallel) as pool:
        ran = list(pool.map(one, range(count)))
    # What the clones name: a schedule (paused: it makes no run of its own) and a webhook
    # for a definition that never runs (it is sent nothing).
    http.post(
        "/api/schedules",
        json={"name": SCHEDULE, "workflow": "image_pipeline", "cron": "0 * * * *", "paused": True},
    ).raise_for_status()
    http.post("/api/webhooks", json={"name": HOOK, "url": "http://127.0.0.1:9/bench",
                                     "workflow": _FIVE_STEPS["name"] + "_never"}
              ).raise_for_status()  # fmt: skip
    return ran


def _wait(http: httpx.Client, run_id: str) -> uuid.UUID:
    while True:
        detail = http.get(
            f"/api/workflows/{run_id}", params={"wait_s": _WAIT_S, "events": 0},
            timeout=_WAIT_S + 30,
        ).raise_for_status().json()  # fmt: skip
        if detail["status"] in ("COMPLETED", "FAILED", "CANCELLED"):
            return uuid.UUID(run_id)


class History:
    """Clones the template runs until the database holds a given number of workflows."""

    def __init__(
        self, database_url: str, templates: list[uuid.UUID], *, spread_days: int = SPREAD_DAYS
    ) -> None:
        self.url = database_url
        self._spread_days = spread_days
        self._templates = templates
        self._conn = connect(database_url)
        self._next = 0  # the clone number the next one gets (its place in time and template)
        self._prepare(templates)

    def close(self) -> None:
        self._conn.close()

    @contextmanager
    def disconnected(self) -> Iterator[None]:
        """The history's session closed meanwhile (Postgres copies a database only while no
        session is open on it), then opened again with its template tables."""
        self._conn.close()
        try:
            yield
        finally:
            self._conn = connect(self.url)
            self._prepare(self._templates)

    def _prepare(self, templates: list[uuid.UUID]) -> None:
        """The template runs' rows in session tables, numbered within their status."""
        with self._conn.transaction():
            self._conn.execute(
                """
                CREATE TEMP TABLE tpl_w AS
                SELECT w.*, w.status::text AS grp,
                       coalesce(w.finished_at, w.created_at) - w.created_at AS took,
                       row_number() OVER (PARTITION BY w.status ORDER BY w.id) - 1 AS k,
                       count(*) OVER (PARTITION BY w.status) AS n
                FROM workflows w WHERE w.id = ANY(%(ids)s)
                """,
                {"ids": templates},
            )
            self._conn.execute(
                """
                CREATE TEMP TABLE tpl_t AS
                SELECT t.*, row_number() OVER (PARTITION BY t.workflow_id ORDER BY t.id) - 1 AS j
                FROM task_runs t WHERE t.workflow_id IN (SELECT id FROM tpl_w)
                """
            )
            self._conn.execute(
                "CREATE TEMP TABLE tpl_e AS "
                "SELECT * FROM events WHERE workflow_id IN (SELECT id FROM tpl_w)"
            )
            self._conn.execute(
                "CREATE TEMP TABLE tpl_h AS "
                "SELECT * FROM handoffs WHERE workflow_id IN (SELECT id FROM tpl_w)"
            )
            row = self._conn.execute("SELECT coalesce(max(j), 0) + 1 FROM tpl_t").fetchone()
            self._per_run = int(row[0]) if row else 1
            groups = {str(r[0]) for r in self._conn.execute("SELECT DISTINCT grp FROM tpl_w")}
            ids = self._conn.execute(
                "SELECT (SELECT id FROM schedules WHERE name = %(s)s), "
                "(SELECT id FROM webhooks WHERE name = %(h)s)",
                {"s": SCHEDULE, "h": HOOK},
            ).fetchone()
            assert ids is not None and None not in ids, "run_templates makes them"
            self._schedule, self._hook = ids
        missing = {status for _, status in _SHARES} - groups
        if missing:
            raise RuntimeError(
                f"no template run ended {', '.join(sorted(missing))}; run more templates"
            )

    def size(self) -> int:
        row = self._conn.execute("SELECT count(*) FROM workflows").fetchone()
        self._conn.commit()
        return int(row[0]) if row else 0

    def grow_to(self, target: int) -> float:
        """Clone runs until there are ``target`` workflows; the seconds it took (VACUUM
        ANALYZE included, as a database that lived that long would have been)."""
        began = time.monotonic()
        left = target - self.size()
        # What the API's housekeeping does as runs happen: the clones' figures folded, and
        # their per-minute ones older than two days dropped; after each chunk, so the deltas
        # waiting stay a chunk's, and a batch a statement as housekeeping folds them.
        engine = make_engine(self.url, pooled=False)
        try:
            while left > 0:
                n = min(CHUNK, left)
                self._clone(self._next, self._next + n)
                self._next += n
                left -= n
                tallies.fold_all(engine)
                with engine.begin() as tx:
                    tx.execute(tallies.PRUNE_MINUTES, {"keep": tallies.KEEP_MINUTES})
        finally:
            engine.dispose()
        with connect(self.url, autocommit=True) as conn:
            for table in ("workflows", "task_runs", "events", "handoffs", "webhook_deliveries"):
                conn.execute(f"VACUUM (ANALYZE) {table}")
            # The fold emptied the clones' deltas at once; until vacuumed, every reader of the
            # figures (stats, a list's total) scans their dead rows (the table has no index).
            # A stack that lived those days folded a few rows a second, autovacuum keeping
            # the table small.
            conn.execute("VACUUM (ANALYZE) tally_deltas")
            # The clones' per-minute and hourly figures came in passes over all their days,
            # and all but two days of them were dropped at once; a stack that lived those days
            # wrote and dropped them as they came, its tables holding two days' rows in that
            # order, vacuumed and analysed as they changed (left as the fold leaves them, the
            # hours' table is mostly dead rows, and its statistics still count a year of
            # hours: Postgres then reads it whole for a window's histograms). So the tables
            # are rewritten in that order and analysed.
            for table, key in (("tallies", "pk_tallies"), ("tally_hours", "pk_tally_hours")):
                conn.execute(f"CLUSTER {table} USING {key}")
                conn.execute(f"ANALYZE {table}")
            conn.execute("VACUUM (ANALYZE) tally_minutes")
        return time.monotonic() - began

    def _clone(self, lo: int, hi: int) -> None:
        k = self._per_run
        conn = self._conn
        with conn.transaction():
            # Task run ids: a block of the sequence (ids of clone i: base + (i - lo) * k + j).
            row = conn.execute(
                "SELECT setval(pg_get_serial_sequence('task_runs', 'id'), "
                "nextval(pg_get_serial_sequence('task_runs', 'id')) + %(n)s) - %(n)s + 1",
                {"n": (hi - lo) * k},
            ).fetchone()
            assert row is not None
            params = {"lo": lo, "hi": hi, "k": k, "base": int(row[0]),
                      "spread": f"{self._spread_days} days", "schedule": self._schedule,
                      "hook": self._hook}  # fmt: skip
            conn.execute(
                """
                CREATE TEMP TABLE clones ON COMMIT DROP AS
                SELECT g.i, gen_random_uuid() AS id, t.id AS tpl,
                       now() - interval '1 minute' - t.took - t.created_at
                       - CAST(%(spread)s AS interval)
                         * (g.i * 0.6180339887498949 - floor(g.i * 0.6180339887498949)) AS shift
                FROM generate_series(%(lo)s::bigint, %(hi)s::bigint - 1) g(i)
                JOIN tpl_w t ON t.k = (g.i / 50) %% t.n AND t.grp = CASE
                    WHEN g.i %% 50 < 43 THEN 'COMPLETED'
                    WHEN g.i %% 50 < 48 THEN 'FAILED' ELSE 'CANCELLED' END
                """,
                params,
            )
            conn.execute(
                """
                INSERT INTO workflows (id, definition, definition_version, status, policy,
                    data_plane, input, output, error, result_uri, created_at, started_at,
                    finished_at, claimed_by, claimed_at, started_by, tags, schedule_id,
                    scheduled_for)
                SELECT c.id, w.definition, w.definition_version, w.status, w.policy,
                    w.data_plane, w.input, w.output, w.error, w.result_uri, w.created_at + c.shift,
                    w.started_at + c.shift, w.finished_at + c.shift, w.claimed_by,
                    w.claimed_at + c.shift, w.started_by, w.tags,
                    CASE WHEN c.i %% 10 = 3 THEN %(schedule)s::uuid END,
                    CASE WHEN c.i %% 10 = 3 THEN w.created_at + c.shift END
                FROM clones c JOIN tpl_w w ON w.id = c.tpl
                """,
                params,
            )
            conn.execute(
                """
                INSERT INTO webhook_deliveries (webhook_id, event, workflow_id, payload, status,
                    attempts, next_attempt_at, last_status, created_at, delivered_at)
                SELECT %(hook)s::uuid, 'workflow.' || lower(w.status::text), c.id,
                    jsonb_build_object('type', 'workflow.' || lower(w.status::text),
                                       'data', jsonb_build_object('workflow_id', c.id)),
                    CASE WHEN c.i %% 50 = 17 THEN 'FAILED' ELSE 'DELIVERED' END::delivery_status,
                    CASE WHEN c.i %% 50 = 17 THEN 8 ELSE 1 END, w.finished_at + c.shift,
                    CASE WHEN c.i %% 50 = 17 THEN 503 ELSE 200 END, w.finished_at + c.shift,
                    CASE WHEN c.i %% 50 = 17 THEN NULL ELSE w.finished_at + c.shift END
                FROM clones c JOIN tpl_w w ON w.id = c.tpl
                """,
                params,
            )
            conn.execute(
                """
                INSERT INTO task_runs (id, workflow_id, ref, task, attempt, status, worker_id,
                    queued_at, started_at, finished_at, queue_wait_ms, run_ms, cpu_ms, bytes_in,
                    bytes_out, error, output, data)
                SELECT %(base)s + (c.i - %(lo)s) * %(k)s + t.j, c.id, t.ref, t.task, t.attempt,
                    t.status, t.worker_id, t.queued_at + c.shift, t.started_at + c.shift,
                    t.finished_at + c.shift, t.queue_wait_ms, t.run_ms, t.cpu_ms, t.bytes_in,
                    t.bytes_out, t.error, t.output, t.data
                FROM clones c JOIN tpl_t t ON t.workflow_id = c.tpl
                """,
                params,
            )
            conn.execute(
                """
                INSERT INTO handoffs (workflow_id, task_run_id, from_container, to_container,
                    bytes, duration_us, from_host, to_host, datum, mode, at)
                SELECT c.id, %(base)s + (c.i - %(lo)s) * %(k)s + t.j, h.from_container,
                    h.to_container, h.bytes, h.duration_us, h.from_host, h.to_host, h.datum,
                    h.mode, h.at + c.shift
                FROM clones c JOIN tpl_h h ON h.workflow_id = c.tpl
                LEFT JOIN tpl_t t ON t.id = h.task_run_id
                """,
                params,
            )
            conn.execute(
                """
                INSERT INTO events (workflow_id, kind, data, at)
                SELECT c.id, e.kind, e.data, e.at + c.shift
                FROM clones c JOIN tpl_e e ON e.workflow_id = c.tpl
                """
            )

    def proportions(self) -> Proportions:
        """Counted, not estimated (a pass over each table)."""
        conn = self._conn
        with conn.transaction():
            counts = {
                table: _count(conn, f"SELECT count(*) FROM {table}")
                for table in ("workflows", "task_runs", "events", "handoffs")
            }
            rows = conn.execute(
                "SELECT status::text, count(*) FROM workflows GROUP BY status"
            ).fetchall()
        total = max(1, counts["workflows"])
        return Proportions(
            workflows=counts["workflows"],
            task_runs=counts["task_runs"] / total,
            events=counts["events"] / total,
            handoffs=counts["handoffs"] / total,
            statuses={str(status): n / total for status, n in rows},
        )


def _count(conn: psycopg.Connection[Any], query: str) -> int:
    row = conn.execute(query).fetchone()
    return int(row[0]) if row else 0
