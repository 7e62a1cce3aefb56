"""Schedules, priorities, concurrency limits, idempotent starts, webhooks and pausing end to end:
a real stack (Postgres, Redis, S3, CDI controller and minion, API, its supervised scheduler,
two workers with three slots each), a second scheduler process beside it where a test needs
two, and a real HTTP receiver for webhooks; schedulers are killed for real (SIGKILL)."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from standardwebhooks.webhooks import Webhook as Verifier

from orchestrator.stack import Stack
from orchestrator.stack.defaults import WORKER_COMMAND
from tests.orchestrator.conftest import deployed_tests_package
from tests.orchestrator.test_api_schedules_webhooks import Receiver
from tests.orchestrator.test_e2e import FINISHED, free_port, wait_for

FEATURE_TASKS = "tests.orchestrator.feature_tasks"
SLOTS = 3  # per worker: six runs could go at once
MAX_ACTIVE = 4


class Features:
    def __init__(self, stack: Stack, folder: Path) -> None:
        self.stack = stack
        self.folder = folder
        self.api = httpx.Client(base_url=stack.api_url, timeout=30, headers=stack.auth_headers)
        self._second: subprocess.Popen[bytes] | None = None

    def ok(self, reply: httpx.Response, status: int = 200) -> Any:
        assert reply.status_code == status, reply.text
        return reply.json() if reply.content else None

    def definition(self, steps: list[dict[str, Any]], **settings: Any) -> str:
        name = f"f_{uuid.uuid4().hex[:8]}"
        body = {"name": name, "tasks": steps, **settings}
        self.ok(self.api.post("/api/workflow-definitions", json=body), 201)
        return name

    def start(self, workflow: str, **extra: Any) -> str:
        body = {"workflow": workflow, "input": extra.pop("input", {}), **extra}
        started: str = self.ok(self.api.post("/api/workflows", json=body), 201)["id"]
        return started

    def get(self, run: str) -> dict[str, Any]:
        found: dict[str, Any] = self.ok(self.api.get(f"/api/workflows/{run}"))
        return found

    def wait(self, run: str, timeout: float = 120) -> dict[str, Any]:
        ended: dict[str, Any] = wait_for(
            lambda: (d := self.get(run)) and d["status"] in FINISHED and d,
            f"run {run}",
            timeout,
        )
        return ended

    def record(self) -> Path:
        """A file the ``hold`` task counts its concurrent runs in."""
        return self.folder / f"record-{uuid.uuid4().hex[:8]}.json"

    def started(self, scheduler: str, since: int) -> None:
        """Wait until ``scheduler``'s log says it started, after byte ``since`` of it (its
        start takes seconds on a busy machine: imports, its liveness lock)."""
        log = self.stack.logs_dir / f"{scheduler}.log"
        wait_for(
            lambda: f"scheduler {scheduler} started" in log.read_text()[since:],
            f"{scheduler} to start",
            120,
        )

    def log_size(self, scheduler: str) -> int:
        log = self.stack.logs_dir / f"{scheduler}.log"
        return len(log.read_text()) if log.exists() else 0

    def start_second_scheduler(self) -> None:
        """Start a second scheduler process beside the stack's and wait until it runs."""
        env = {**os.environ, **self.stack.environment()}
        env.pop("CDIFLOW_ALIVE_FILE", None)  # the stack's scheduler's own stamp
        since = self.log_size("scheduler-2")
        log = open(self.stack.logs_dir / "scheduler-2.log", "ab")  # noqa: SIM115 - the child's
        self._second = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.scheduler", "--id", "scheduler-2"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        self.started("scheduler-2", since)

    def kill_second_scheduler(self) -> None:
        if self._second is not None:
            self._second.send_signal(signal.SIGKILL)
            self._second.wait(10)
            self._second = None


@pytest.fixture(scope="module")
def features() -> Iterator[Features]:
    folder = Path(tempfile.mkdtemp(prefix="cdiflow-features-"))
    os.chmod(folder, 0o755)
    # Each scheduler runs at most this many at once: a backlog is shared between two.
    os.environ["MAX_ACTIVE_WORKFLOWS"] = str(MAX_ACTIVE)
    worker = (*WORKER_COMMAND, "--concurrency", str(SLOTS))
    try:
        with (
            deployed_tests_package(),  # the tests' own tasks
            Stack(folder, workers=2, port=free_port(), tasks=[FEATURE_TASKS],
                  worker_command=worker) as stack,
        ):  # fmt: skip
            f = Features(stack, folder)
            reply = f.api.put(
                "/api/tasks/hold", json={"name": "hold", "module": f"{FEATURE_TASKS}:hold"}
            )
            assert reply.status_code in (200, 201), reply.text  # fmt: skip
            yield f
            f.kill_second_scheduler()
            f.api.close()
    finally:
        os.environ.pop("MAX_ACTIVE_WORKFLOWS", None)
        subprocess.run(["rm", "-rf", str(folder)], check=False)


@pytest.fixture
def two_schedulers(features: Features) -> Iterator[Features]:
    features.start_second_scheduler()
    try:
        yield features
    finally:
        features.kill_second_scheduler()


def _most(record: Path) -> int:
    most: int = json.loads(record.read_text())["most"]
    return most


def _sampled(probe: Callable[[], int], until: Callable[[], bool]) -> list[int]:
    """``probe()`` every 50 ms until ``until()``."""
    seen = []
    while not until():
        seen.append(probe())
        time.sleep(0.05)
    return seen


# --- schedules ------------------------------------------------------------------------------


def test_a_schedule_fires_once_per_tick_with_two_schedulers_and_across_restarts(
    two_schedulers: Features,
) -> None:
    f = two_schedulers
    flow = f.definition([{"ref": "a", "task": "noop"}])
    name = f"every-second-{uuid.uuid4().hex[:6]}"
    f.ok(f.api.post("/api/schedules", json={"name": name, "workflow": flow,
                                             "cron": "* * * * * *"}), 201)  # fmt: skip

    def made() -> list[dict[str, Any]]:
        page = f.api.get("/api/workflows", params={"schedule": name, "limit": 200})
        runs: list[dict[str, Any]] = page.json()["items"]
        return runs

    wait_for(lambda: len(made()) >= 3, "three ticks with two schedulers")
    first = f.stack.scheduler_id
    since = f.log_size(first)
    f.stack.kill(first)  # the stack restarts it; the second scheduler goes on meanwhile
    count = len(made())
    wait_for(lambda: len(made()) >= count + 3, "three ticks with one scheduler")
    f.started(first, since)
    since = f.log_size(first)
    f.stack.kill(first)  # now both die at once: no scheduler for a while
    f.kill_second_scheduler()
    killed = time.time()
    time.sleep(3)
    f.start_second_scheduler()
    f.started(first, since)
    wait_for(
        lambda: any(datetime.fromisoformat(r["scheduled_for"]).timestamp() > time.time() - 0.5
                    for r in made()),
        "ticks to be on time again",
    )  # fmt: skip
    f.ok(f.api.post(f"/api/schedules/{name}/pause"))
    time.sleep(1.5)  # a tick being made as it was paused is committed by now
    runs = made()
    ticks = sorted(datetime.fromisoformat(r["scheduled_for"]) for r in runs)
    assert ticks[-1].timestamp() > killed + 3  # it went on after the downtime
    assert len(set(ticks)) == len(ticks)  # no tick twice
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(ticks)]
    assert gaps == [1.0] * len(gaps), ticks  # none missed: the downtime's were made late
    for run in runs:
        assert f.wait(run["id"])["status"] == "COMPLETED"
    assert f.stack.restarts(f.stack.scheduler_id) >= 2


# --- priorities and limits -------------------------------------------------------------------


def test_priorities_order_a_backlog(features: Features) -> None:
    f = features
    flow = f.definition([{"ref": "a", "task": "hold", "params": {"s": 0.3}}])
    f.ok(f.api.post(f"/api/workflow-definitions/{flow}/pause"))
    low = [f.start(flow, priority=-10) for _ in range(6)]
    middle = [f.start(flow) for _ in range(3)]
    high = [f.start(flow, priority=10) for _ in range(6)]
    time.sleep(1.5)
    assert {f.get(r)["status"] for r in low + middle + high} == {"PENDING"}  # the queue waits
    f.ok(f.api.post(f"/api/workflow-definitions/{flow}/resume"))
    placed = {r: f.wait(r)["task_runs"][0]["queued_at"] for r in low + middle + high}
    assert sorted(placed, key=lambda r: placed[r]) == high + middle + low


def test_a_task_limit_is_never_exceeded_under_load_with_two_schedulers(
    two_schedulers: Features,
) -> None:
    f = two_schedulers
    f.ok(f.api.put("/api/tasks/hold", json={"name": "hold", "module": f"{FEATURE_TASKS}:hold",
                                            "max_concurrency": 2}))  # fmt: skip
    try:
        record = f.record()
        flow = f.definition([{"ref": "a", "task": "hold", "params": {"s": 0.4}},
                             {"ref": "b", "task": "hold", "params": {"s": 0.2},
                              "depends_on": ["a"]}])  # fmt: skip
        runs = [f.start(flow, input={"data": {"record": str(record)}}) for _ in range(14)]
        done = [f.wait(r) for r in runs]
        assert {d["status"] for d in done} == {"COMPLETED"}
        assert _most(record) == 2  # reached, never passed (six slots could have run six)
        assert len({d["claimed_by"] for d in done}) == 2  # both schedulers placed some
    finally:
        f.api.put("/api/tasks/hold", json={"name": "hold", "module": f"{FEATURE_TASKS}:hold"})


def test_a_definitions_run_limit_holds_under_load_with_two_schedulers(
    two_schedulers: Features,
) -> None:
    f = two_schedulers
    record = f.record()
    flow = f.definition([{"ref": "a", "task": "hold", "params": {"s": 0.3}},
                         {"ref": "b", "task": "hold", "params": {"s": 0.1},
                          "depends_on": ["a"]}], max_concurrent_runs=3)  # fmt: skip
    time.sleep(6)  # the schedulers learn that a limit exists (they look every 5 s)
    runs = [f.start(flow, input={"data": {"record": str(record)}}) for _ in range(15)]

    def running() -> int:
        page = f.api.get("/api/workflows", params={"workflow": flow, "status": "RUNNING"})
        count: int = page.json()["total"]
        return count

    def finished() -> bool:
        page = f.api.get("/api/workflows", params={"workflow": flow, "limit": 50}).json()
        return all(r["status"] in FINISHED for r in page["items"])

    seen = _sampled(running, finished)
    assert max(seen) == 3, seen
    assert _most(record) <= 3
    assert {f.get(r)["status"] for r in runs} == {"COMPLETED"}


# --- idempotent starts -----------------------------------------------------------------------


def test_concurrent_starts_with_one_idempotency_key_make_one_run(features: Features) -> None:
    f = features
    flow = f.definition([{"ref": "a", "task": "noop"}])
    key = {"Idempotency-Key": str(uuid.uuid4())}
    body = {"workflow": flow, "input": {"data": {"order": 7}}, "tags": ["once"]}

    def post(_: int) -> str:
        with httpx.Client(base_url=f.stack.api_url, headers=f.stack.auth_headers) as client:
            reply = client.post("/api/workflows", json=body, headers=key, timeout=30)
            assert reply.status_code == 201, reply.text
            run: str = reply.json()["id"]
            return run

    with ThreadPoolExecutor(10) as pool:
        runs = set(pool.map(post, range(20)))
    assert len(runs) == 1
    (run,) = runs
    assert f.wait(run)["status"] == "COMPLETED"
    found = f.ok(f.api.get("/api/workflows", params={"workflow": flow, "tag": "once"}))
    assert [r["id"] for r in found["items"]] == [run]


# --- webhooks --------------------------------------------------------------------------------


def test_a_webhook_is_delivered_signed_and_retried_after_the_receiver_fails(
    features: Features,
) -> None:
    f = features
    receiver = Receiver([502])  # the first delivery fails
    try:
        flow = f.definition([{"ref": "a", "task": "noop"},
                             {"ref": "b", "task": "noop", "depends_on": ["a"]}])  # fmt: skip
        hook = f.ok(f.api.post("/api/webhooks", json={
            "name": f"hook-{uuid.uuid4().hex[:6]}", "url": receiver.url, "workflow": flow,
            "events": ["workflow.completed", "task.completed"]}), 201)  # fmt: skip
        run = f.start(flow)
        assert f.wait(run)["status"] == "COMPLETED"
        wait_for(lambda: len(receiver.got) >= 4, "three deliveries, one of them twice", 60)
        verifier = Verifier(hook["secret"])
        payloads = [verifier.verify(body, headers) for headers, body, _ in receiver.got]
        kinds = sorted(p["type"] for p in payloads[1:])
        assert kinds == ["task.completed", "task.completed", "workflow.completed"]
        assert {p["data"]["workflow_id"] for p in payloads} == {run}
        first_id = receiver.got[0][0]["webhook-id"]
        assert [h["webhook-id"] for h, _, _ in receiver.got].count(first_id) == 2  # retried
        log = f.ok(f.api.get(f"/api/webhooks/{hook['name']}/deliveries"))
        assert log["total"] == 3
        assert {d["status"] for d in log["items"]} == {"DELIVERED"}
        assert sorted(d["attempts"] for d in log["items"]) == [1, 1, 2]
        scheduler_log = (f.stack.logs_dir / "scheduler-1.log").read_text()
        assert hook["secret"] not in scheduler_log and "t0k" not in scheduler_log
    finally:
        receiver.close()


# --- pausing -------------------------------------------------------------------------------


def test_a_paused_run_waits_and_goes_on_when_resumed(features: Features) -> None:
    f = features
    steps = [{"ref": "a", "task": "hold", "params": {"s": 1.0}},
             {"ref": "b", "task": "hold", "params": {"s": 0.1}, "depends_on": ["a"]},
             {"ref": "c", "task": "hold", "params": {"s": 0.1}, "depends_on": ["b"]}]  # fmt: skip
    flow = f.definition(steps)
    run = f.start(flow)
    wait_for(lambda: f.get(run)["task_runs"], "the first step to go out")
    paused = f.ok(f.api.post(f"/api/workflows/{run}/pause"))
    assert paused["paused_at"] is not None
    wait_for(lambda: f.get(run)["task_runs"][0]["status"] == "COMPLETED", "step a to end")
    time.sleep(2)  # long enough for b and c, had the run not been paused
    held = f.get(run)
    assert held["status"] == "RUNNING" and [t["ref"] for t in held["task_runs"]] == ["a"]
    f.ok(f.api.post(f"/api/workflows/{run}/resume"))
    done = f.wait(run)
    assert done["status"] == "COMPLETED"
    assert [t["ref"] for t in done["task_runs"]] == ["a", "b", "c"]
    kinds = [e["kind"] for e in done["events"]]
    assert kinds.index("workflow.paused") < kinds.index("workflow.unpaused")
