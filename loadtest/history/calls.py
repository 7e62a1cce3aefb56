"""The calls the benchmark times at each history size: what a user and the dashboard ask the
API, the scrape, the scheduler's tick and a new run, each the median of several.

Each call is made as its client makes it (HTTP with the API key; the scheduler's statements on
a connection of its own), after one call that is not counted (it warms the connection and the
statement cache), and timed in rounds across the sizes (``time_rounds``).
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import httpx
import psycopg

from loadtest.history.grow import HOOK, SCHEDULE
from orchestrator.controller.metrics import CACHE_S
from orchestrator.db import run_statements
from orchestrator.db.scheduler_liveness import LIVENESS_CLASS, alive_schedulers_sql

__all__ = ["OVERVIEW_POLL_S", "Call", "Probe", "calls", "overview_poll", "time_rounds"]

OVERVIEW_POLL_S: Final = 2.5  # the dashboard overview's refresh
METRICS_CACHE_S: Final = CACHE_S + 0.2
_TICK_ID: Final = "bench-history-tick"  # a scheduler that owns nothing: the tick finds no work
_ORPHANED: Final = (
    "SELECT DISTINCT claimed_by FROM workflows w WHERE status = 'RUNNING' "
    "AND claimed_by IS NOT NULL AND claimed_by <> %(me)s AND NOT "
) + alive_schedulers_sql("w.claimed_by")


@dataclass(frozen=True)
class Call:
    """One thing a client does, and how to make it once; ``before``: what must happen first,
    not timed (a cache to wait out; once a round, as the wait serves every size at once)."""

    name: str
    make: Callable[[], None]
    before: Callable[[], None] | None = None


@dataclass(frozen=True)
class Probe:
    """What the calls need to know of the history: a run deep in it, the number of runs, a
    delivery deep in the webhook's log, when the history begins."""

    total: int
    deep_run: dict[str, Any]  # a run half-way down the newest-first list
    deep_cursor: str | None  # the cursor of the page starting there (None: the API has none)
    deep_delivery: int | None  # a delivery half-way down the webhook's log (None: it is empty)
    oldest: datetime  # the first run's creation


def _ok(reply: httpx.Response) -> None:
    reply.raise_for_status()


def overview_poll(http: httpx.Client, pool: ThreadPoolExecutor, window_minutes: int = 15) -> None:
    """One refresh of the dashboard's overview: its four requests at once, as the page sends
    them."""
    paths = [
        f"/api/stats?window_minutes={window_minutes}",
        "/api/workflows?limit=8",
        "/api/workers",
        "/api/cdi/objects",
    ]
    for reply in pool.map(http.get, paths):
        if reply.request.url.path != "/api/cdi/objects":  # the page tolerates its failure
            _ok(reply)


def calls(
    http: httpx.Client,
    pool: ThreadPoolExecutor,
    probe: Probe,
    scheduler: psycopg.Connection[Any],
    new_run: Callable[[], None],
) -> list[Call]:
    """Every call, in the order they are timed."""
    deep = probe.deep_run
    run_id = deep["id"]
    prefix = str(run_id)[:6]
    # The deep run's input: about a fifth of the history was started on the same image (a
    # tenth, the failed runs, on the missing one).
    input_filter = json.dumps({"image": deep["input"]["image"]})
    now = datetime.now(UTC)
    past = probe.oldest - timedelta(days=45)  # before the history: a window with no rows
    half_way = {} if probe.deep_delivery is None else {"before_id": probe.deep_delivery}

    def get(path: str, **params: Any) -> Callable[[], None]:
        return lambda: _ok(http.get(path, params=params))

    def deep_page() -> None:
        if probe.deep_cursor is not None:
            _ok(http.get("/api/workflows", params={"limit": 50, "cursor": probe.deep_cursor}))
        else:
            _ok(http.get("/api/workflows", params={"limit": 50, "offset": probe.total // 2}))

    def tick() -> None:
        # Rolled back: were a run PENDING meanwhile, this scheduler that does not run must
        # not keep it.
        me = {"me": _TICK_ID}
        try:
            scheduler.execute(
                run_statements.CLAIM, {**me, "limit": 32, "reclaim_s": 60.0}
            ).fetchall()
            scheduler.execute(
                run_statements.RESUME, {**me, "reason": "bench", "running": []}
            ).fetchall()
            scheduler.execute(_ORPHANED, {**me, "cls": LIVENESS_CLASS}).fetchall()
        finally:
            scheduler.rollback()

    return [
        Call("workflows: first page", get("/api/workflows", limit=50)),
        Call("workflows: deep page (half-way)", deep_page),
        Call("workflows: by status (FAILED)", get("/api/workflows", limit=50, status="FAILED")),
        Call("workflows: by definition",
             get("/api/workflows", limit=50, workflow="bench_five_steps")),
        Call("workflows: by policy", get("/api/workflows", limit=50, policy="transfer")),
        # Three days: a full page at every size (a year of 10k runs has about one an hour; an
        # hour's window would compare an empty page with a full one, not the history's cost).
        Call("workflows: created in the last 3 days",
             get("/api/workflows", limit=50, created_after=(now - timedelta(days=3)).isoformat())),
        Call("workflows: id prefix", get("/api/workflows", limit=50, q=prefix)),
        Call("workflows: by tag (20 %)", get("/api/workflows", limit=50, tag="nightly")),
        Call("workflows: by tag (2 %)", get("/api/workflows", limit=50, tag="rare")),
        Call("workflows: by tag and status",
             get("/api/workflows", limit=50, tag="rare", status="FAILED")),
        Call("workflows: by input", get("/api/workflows", limit=50, input=input_filter)),
        Call("workflows: by schedule", get("/api/workflows", limit=50, schedule=SCHEDULE)),
        Call("schedules", get("/api/schedules")),
        Call("webhook deliveries: first page", get(f"/api/webhooks/{HOOK}/deliveries", limit=50)),
        Call("webhook deliveries: deep page (half-way)",
             get(f"/api/webhooks/{HOOK}/deliveries", limit=50, **half_way)),
        Call("webhook deliveries: FAILED",
             get(f"/api/webhooks/{HOOK}/deliveries", limit=50, status="FAILED")),
        Call("run detail", get(f"/api/workflows/{run_id}")),
        Call("run events", get(f"/api/workflows/{run_id}/events")),
        Call("stats: 15 min", get("/api/stats", window_minutes=15)),
        Call("stats: 6 h", get("/api/stats", window_minutes=360)),
        # Every scrape reads afresh, as Prometheus's every 15 s do: not the API's 5 s cache.
        Call("metrics scrape", get("/metrics"), before=lambda: time.sleep(METRICS_CACHE_S)),
        Call("task runs: a window with no rows",
             get("/api/task-runs", finished_after=past.isoformat(),
                 started_before=(past + timedelta(minutes=5)).isoformat())),
        Call("task runs: the last 5 minutes",
             get("/api/task-runs", finished_after=(now - timedelta(minutes=5)).isoformat(),
                 started_before=now.isoformat())),
        Call("task runs: active", get("/api/task-runs/active")),
        Call("dashboard: overview poll", lambda: overview_poll(http, pool)),
        Call("scheduler tick", tick),
        Call("new run, start to finish", new_run),
    ]  # fmt: skip


def time_rounds(
    at_sizes: Sequence[Call], rounds: int, since: float
) -> list[list[tuple[float, float]]]:
    """One call at every history size, in ``rounds`` rounds, each round making it at every
    size one after another (so the times of a round are seconds apart, under the same load),
    after one call at each that is not counted. Per size, per round: (when it began, seconds
    after ``since``; milliseconds it took)."""
    for call in at_sizes:
        call.make()
    timed: list[list[tuple[float, float]]] = [[] for _ in at_sizes]
    for _ in range(rounds):
        if at_sizes[0].before is not None:
            at_sizes[0].before()  # every size was last called before this wait
        for call, times in zip(at_sizes, timed, strict=True):
            began = time.perf_counter()
            call.make()
            times.append((began - since, (time.perf_counter() - began) * 1000.0))
    return timed


def median(values: list[float]) -> float:
    return float(statistics.median(values))
