"""Runs under control, end to end: a real stack (Postgres, Redis, S3 endpoint, CDI controller
and minion, API, scheduler) started with no worker, as ``cdiflow up --workers 0``, and a worker
this module starts and stops itself.

* With no worker, a run says what it waits for and ``/api/readyz`` is not ready; a worker
  that comes makes it go on.
* A cancelled or timed-out run's running task is stopped on its worker, whether it stops when
  asked (the bundled ``sleep`` waits on ``ctx.cancelled``) or not (a ``time.sleep``: the
  worker ends its process and its keeper starts a fresh one); its statuses say CANCELLED or
  TIMED_OUT, its objects are freed, and the worker takes the next task at once.
* A run's events come in order: every step's end before the run's.

The time from the stop to the worker's next task is printed (``-s`` shows it); the tests bound
it generously, the issue's figure being two seconds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

import cdi
from orchestrator.stack import Stack
from tests.orchestrator.conftest import deployed_tests_package
from tests.orchestrator.test_e2e import FLAKY_TASKS, Harness, free_port, wait_for
from workflows.samples import bundled_samples

WORKER = "worker-1"
# What the issue asks for is two seconds; the bound leaves room for a loaded machine.
FREED_WITHIN_S = 5.0


class Worker:
    """A worker process of this module's own (``python -m orchestrator.worker``), stopped by
    PID."""

    def __init__(self, stack: Stack, log: Path) -> None:
        self.log = log
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "orchestrator.worker", "--id", WORKER],
                env=stack.environment(),
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="module")
def harness() -> Iterator[Harness]:
    folder = tempfile.mkdtemp(prefix="cdiflow-control-")
    os.chmod(folder, 0o755)
    try:
        with (
            deployed_tests_package(),  # the tests' own tasks
            Stack(folder, workers=0, port=free_port(), tasks=[FLAKY_TASKS]) as stack,
        ):
            h = Harness(stack)
            yield h
            h.api.close()
    finally:
        subprocess.run(["rm", "-rf", folder], check=False)


@pytest.fixture(scope="module")
def worker(harness: Harness) -> Iterator[Worker]:
    """The module's one worker, started by the first test that needs it."""
    started = Worker(harness.stack, harness.stack.logs_dir / "test-worker.log")
    try:
        wait_for(lambda: _beat(harness) is not None, "the worker's first heartbeat")
        yield started
    finally:
        started.stop()


def _beat(harness: Harness) -> dict[str, Any] | None:
    beats = {w["id"]: w for w in harness.api.get("/api/workers").json()}
    beat = beats.get(WORKER)
    return beat if beat is not None and beat["alive"] else None


def _define(harness: Harness, name: str, steps: list[dict[str, Any]], **limits: Any) -> str:
    reply = harness.api.post("/api/workflow-definitions", json={"name": name, "tasks": steps,
                                                                **limits})  # fmt: skip
    assert reply.status_code == 201, reply.text
    return name


def _start(harness: Harness, workflow: str, **extra: Any) -> str:
    reply = harness.api.post("/api/workflows", json={"workflow": workflow, "input": {}, **extra})
    assert reply.status_code == 201, reply.text
    run_id: str = reply.json()["id"]
    return run_id


def _running(harness: Harness, run_id: str, ref: str) -> bool:
    """Whether the worker holds the step's task now (its heartbeat counts it running)."""
    runs = [r for r in harness.get(run_id)["task_runs"] if r["ref"] == ref]
    beat = _beat(harness)
    return bool(runs) and beat is not None and beat["running"] >= 1


def _at(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


def _objects_of(harness: Harness, run_id: str) -> list[str]:
    with cdi.Client(harness.stack.minion_socket) as probe:
        return [o["key"] for o in probe.list_objects() if run_id in o["key"]]


def test_a_run_with_no_worker_says_so_until_one_comes(harness: Harness) -> None:
    ready = harness.api.get("/api/readyz")
    assert ready.status_code == 503
    workers = ready.json()["checks"]["workers"]
    assert not workers["ok"] and workers["detail"].startswith("no live worker"), workers
    image = harness.upload("in/control.jpg", bundled_samples()["sunset.jpg"].read_bytes())
    run_id = harness.start(image)

    def waiting() -> dict[str, Any] | None:
        run = harness.get(run_id)
        return run if run["status_detail"] else None

    run = wait_for(waiting, "the run to say what it waits for", timeout=30)
    assert run["status"] == "RUNNING"
    assert run["status_detail"].startswith(
        "waiting for a worker that loads 'workflows.image_tasks' to run step 'deblur': no "
        "worker is alive"
    ), run["status_detail"]
    assert "task.waiting" in [e["kind"] for e in run["events"]]

    started = Worker(harness.stack, harness.stack.logs_dir / "late-worker.log")
    try:
        done = harness.wait(run_id)
        assert done["status"] == "COMPLETED", done["error"]
        assert done["status_detail"] is None
        kinds = [e["kind"] for e in done["events"]]
        assert kinds.index("task.waiting") < kinds.index("task.unblocked"), kinds
        wait_for(lambda: harness.api.get("/api/readyz").status_code == 200, "readyz ready")
    finally:
        started.stop()


def test_events_come_in_order(harness: Harness, worker: Worker) -> None:
    image = harness.upload("in/order.jpg", bundled_samples()["night.jpg"].read_bytes())
    done = harness.wait(harness.start(image, policy="transfer"))
    assert done["status"] == "COMPLETED", done["error"]
    events = harness.api.get(f"/api/workflows/{done['id']}/events").json()["events"]
    kinds = [e["kind"] for e in events]
    assert kinds[0] == "workflow.created" and kinds[-1] == "workflow.completed", kinds
    assert kinds.count("task.completed") == 3, kinds


@pytest.mark.parametrize(
    "task", ["sleep", "stubborn_sleep"], ids=["stops-when-asked", "will-not-stop"]
)
def test_cancel_stops_the_task_frees_its_objects_and_the_worker_takes_the_next(
    harness: Harness, worker: Worker, task: str
) -> None:
    """A 20 s nap cancelled while it runs: its task run ends CANCELLED at once, the objects
    of the run are freed, and the worker runs the next run's task."""
    if task == "stubborn_sleep":
        body = {"name": task, "module": f"{FLAKY_TASKS}:{task}"}
        assert harness.api.post("/api/tasks", json=body).status_code == 201
    nap = _define(harness, f"cancel_{task}", [
        {"ref": "deblur", "task": "deblur"},
        {"ref": "nap", "task": task, "depends_on": ["deblur"], "params": {"ms": 20_000}},
    ])  # fmt: skip
    image = harness.upload(f"in/cancel-{task}.jpg", bundled_samples()["blue_sky.jpg"].read_bytes())
    run_id = harness.start(image, workflow=nap)
    wait_for(lambda: _running(harness, run_id, "nap"), "the nap to run")
    before = _beat(harness)
    assert before is not None
    after = _define(harness, f"after_{task}", [{"ref": "next", "task": "noop"}])
    next_id = _start(harness, after)  # waits behind the nap: the worker has one slot
    asked = time.time()
    assert harness.api.post(f"/api/workflows/{run_id}/cancel").status_code == 200
    done = harness.wait(next_id)
    assert done["status"] == "COMPLETED", done["error"]
    took_next = _at(done["task_runs"][-1]["started_at"]) - asked

    cancelled = harness.wait(run_id)
    assert cancelled["status"] == "CANCELLED"
    naps = [r for r in cancelled["task_runs"] if r["ref"] == "nap"]
    assert [r["status"] for r in naps] == ["CANCELLED"], naps
    assert naps[0]["error"] == "stopped: the run was cancelled"
    stopped_in = _at(naps[0]["finished_at"]) - asked
    wait_for(lambda: _objects_of(harness, run_id) == [], "the run's objects to be freed", 10)
    restarted = _beat(harness)
    assert restarted is not None
    if task == "sleep":
        assert restarted["started_at"] == before["started_at"]  # the same process went on
    else:
        assert restarted["started_at"] != before["started_at"]  # a fresh one took over
        assert "time.sleep(" in (naps[0]["traceback"] or ""), naps[0]
    print(f"\ncancel ({task}): task stopped {stopped_in:.2f} s, worker took the next task "
          f"{took_next:.2f} s after the cancel")  # fmt: skip
    assert stopped_in < FREED_WITHIN_S and took_next < FREED_WITHIN_S, (stopped_in, took_next)
    assert worker.proc.poll() is None  # the worker as the stack sees it never stopped


def test_a_run_past_its_time_limit_ends_timed_out_with_its_step_and_frees_the_worker(
    harness: Harness, worker: Worker
) -> None:
    flow = _define(harness, "limited_nap", [
        {"ref": "nap", "task": "sleep", "params": {"ms": 20_000}},
        {"ref": "never", "task": "noop", "depends_on": ["nap"]},
    ], timeout_s=2)  # fmt: skip
    run_id = _start(harness, flow)
    done = harness.wait(run_id, timeout=60)
    assert done["status"] == "TIMED_OUT", done
    assert done["error"].startswith(
        "the run passed its time limit of 2 s in step 'nap' (attempt 1, on worker-1)"
    ), done["error"]
    # The run ends at its limit; its step's own ending comes with the worker's report.
    [nap] = wait_for(
        lambda: [r for r in harness.get(run_id)["task_runs"] if r["finished_at"]],
        "the stopped step's report", FREED_WITHIN_S + 5,
    )  # fmt: skip
    assert (nap["ref"], nap["status"]) == ("nap", "TIMED_OUT")
    assert len(harness.get(run_id)["task_runs"]) == 1  # "never" never started
    limit_at = _at(done["started_at"]) + 2
    stopped_in = _at(nap["finished_at"]) - limit_at
    after = _start(harness, _define(harness, "after_limit", [{"ref": "n", "task": "noop"}]))
    assert harness.wait(after)["status"] == "COMPLETED"
    print(f"\ntime limit: task stopped {stopped_in:.2f} s after the limit")
    assert stopped_in < FREED_WITHIN_S, stopped_in
