"""How a chaos case reads back what it started: every run, however many, by the list's
cursor. A small fake API here: the real list's cursor paging is tested against Postgres in
``tests/orchestrator/test_history_lists.py``."""

from __future__ import annotations

import time
from typing import Any

import httpx

from loadtest.chaos.workload import PAGE, PIPELINE, Started, Workload
from orchestrator.db.repository import COUNT_CAP  # a filtered list's total counts up to it

MAX_OFFSET = 10_000  # the API's, past which an offset is refused


class _Api:
    """``GET /api/workflows``: ``rows`` newest first, by cursor (an index here), refusing an
    offset past ``MAX_OFFSET`` and capping the total at ``COUNT_CAP`` as the API does (every
    row matches every filter here)."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows, self.calls = rows, 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.calls += 1
        offset = int(request.url.params.get("offset", "0"))
        if offset > MAX_OFFSET:
            return httpx.Response(422, json={"detail": "offset too large"})
        limit = int(request.url.params["limit"])
        start = offset + int(request.url.params.get("cursor", "0"))
        page = self.rows[start : start + limit]
        after = start + limit
        cursor = str(after) if after < len(self.rows) else None
        total = min(len(self.rows), COUNT_CAP)
        return httpx.Response(200, json={
            "items": page, "next_cursor": cursor, "total": total,
            "total_exact": total == len(self.rows),
        })  # fmt: skip


def _workload(api: _Api) -> Workload:
    work = Workload.__new__(Workload)  # no stack: only its API client is used here
    work.api = httpx.Client(base_url="http://api.test", transport=httpx.MockTransport(api))
    work._singles = 0
    work.workflows = [PIPELINE]  # one definition: each status's rows are counted once
    return work


def test_every_run_is_read_past_the_apis_offset_limit() -> None:
    count = MAX_OFFSET + 3 * PAGE
    now = time.time()
    runs = {f"run-{i}": Started(f"run-{i}", "in.jpg", "auto", "cdi", now) for i in range(count)}
    rows = [{"id": run_id, "status": "COMPLETED", "finished_at": None} for run_id in runs]
    api = _Api(rows[::-1])
    work = _workload(api)
    work.refresh(runs)
    assert all(r.status == "COMPLETED" for r in runs.values())
    assert api.calls == -(-count // PAGE)  # a page per 200, not a request per run


def test_finished_runs_are_counted_past_the_apis_count_cap() -> None:
    count = COUNT_CAP + 2 * PAGE + 7
    rows = [{"id": f"run-{i}", "status": "COMPLETED", "finished_at": None} for i in range(count)]
    work = _workload(_Api(rows))
    # Each of the four finished statuses matches every row in this fake: four times the rows,
    # each past the cap counted page by page.
    assert work.finished_since(time.time() - 60) == 4 * count


def test_finished_runs_under_the_cap_take_one_request_a_status() -> None:
    rows = [{"id": f"run-{i}", "status": "COMPLETED", "finished_at": None} for i in range(30)]
    api = _Api(rows)
    assert _workload(api).finished_since(time.time() - 60) == 4 * 30
    assert api.calls == 4


def test_a_stuck_run_is_reported_with_its_task_runs_and_last_events() -> None:
    detail = {
        "status": "RUNNING",
        "task_runs": [
            {"ref": "input", "attempt": 1, "status": "COMPLETED", "worker_id": "worker-1"},
            {"ref": "join", "attempt": 1, "status": "QUEUED", "worker_id": None},
        ],
        "events": [{"kind": f"e{i}", "data": {"i": i}} for i in range(20)],
    }

    def api(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/api/workflows/run-1"
        return httpx.Response(200, json=detail)

    work = Workload.__new__(Workload)  # no stack: only its API client is used here
    work.api = httpx.Client(base_url="http://api.test", transport=httpx.MockTransport(api))
    where = work.where_stuck(Started("run-1", "in.jpg", "auto", "cdi", time.time()))
    assert where["status"] == "RUNNING" and where["policy"] == "auto"
    assert where["task_runs"] == ["input#1 COMPLETED on worker-1", "join#1 QUEUED on None"]
    assert where["events"] == [f'e{i} {{"i": {i}}}' for i in range(8, 20)]  # the last twelve
