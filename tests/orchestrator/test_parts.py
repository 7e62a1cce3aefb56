"""A data plane and a placement policy are parts: a toy of each, put in its table, changes what
a real scheduler (and worker) do, against real Postgres and Redis, with no other code changed.
What a new plane or policy touches is its module, its row in the table and its tests
(``docs/extending.md``)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient

from orchestrator.contract import keys
from orchestrator.contract.messages import Instruction, Report
from orchestrator.contract.vocabulary import DataPlane, Policy, TaskRunStatus
from orchestrator.scheduler.context import SchedulerContext
from orchestrator.scheduler.data import Datum
from orchestrator.scheduler.instructions import common_fields
from orchestrator.scheduler.planes import PLANES, Plane, Received
from orchestrator.scheduler.policies import POLICIES, Ahead, Choice, PlacementPolicy
from orchestrator.scheduler.runs import RunState, StepRun
from orchestrator.settings import Settings
from orchestrator.worker import planes as worker_planes
from orchestrator.worker.execution import Execution, TaskCall
from orchestrator.worker.worker import Worker
from tests.orchestrator.scheduler_support import (
    WORKER,
    MinionUp,
    beat,
    close_scheduler,
    make_scheduler,
)
from tests.orchestrator.worker.support import poll
from workflows.binding import IMAGE
from workflows.loader import load_deployed
from workflows.sources import BUNDLED

OTHER = "worker-zz"  # sorts after ``WORKER``
IMAGE_URI = "s3://cdiflow/images/any.jpg"


def test_every_plane_and_policy_has_its_part() -> None:
    assert set(PLANES) == set(DataPlane) == set(worker_planes.PLANES)
    assert set(POLICIES) == set(Policy)


# -- a toy policy ------------------------------------------------------------------------------


class Last(PlacementPolicy):
    """Every step to the live worker whose id sorts last, which keeps what it makes."""

    def choose(self, choice: Choice) -> str | None:
        alive = sorted(w.worker_id for w in choice.alive)
        return alive[-1] if alive else None

    def keeps(self, ahead: Ahead) -> bool:
        return ahead.may_keep()


@pytest.fixture
def two_workers(api_redis: redis.Redis) -> Iterator[None]:
    """``WORKER`` idle, ``OTHER`` with five tasks queued; their queues empty."""
    for worker in (WORKER, OTHER):
        api_redis.delete(keys.worker_queue_key(worker))
    beat(api_redis, started_at=1000.0)
    beat(api_redis, started_at=1000.0, worker=OTHER, queue_depth=5)
    yield
    for worker in (WORKER, OTHER):
        api_redis.srem(keys.WORKERS, worker)
        api_redis.delete(keys.worker_key(worker), keys.worker_queue_key(worker))


def _first_step(
    api_settings: Settings, api_client: TestClient, api_redis: redis.Redis
) -> tuple[str, Instruction]:
    """Start an image pipeline under ``transfer`` and claim it: the worker its first step went
    to, and the instruction."""
    body = {"workflow": "image_pipeline", "input": {"image": IMAGE_URI}, "policy": "transfer"}
    started = api_client.post("/api/workflows", json=body)
    assert started.status_code == 201, started.text
    own = make_scheduler(api_settings, cdi=MinionUp())
    try:
        own.claims.claim()
    finally:
        close_scheduler(own)
    for worker in (WORKER, OTHER):
        raw = api_redis.rpop(keys.worker_queue_key(worker))
        if isinstance(raw, str):
            return worker, Instruction.loads(raw)
    raise AssertionError("no instruction was pushed")


@pytest.mark.usefixtures("two_workers")
def test_a_toy_policy_in_the_table_places_the_steps(
    api_settings: Settings,
    api_client: TestClient,
    api_redis: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The policy as it is: the idle worker, which is the next step's choice too (it keeps).
    worker, first = _first_step(api_settings, api_client, api_redis)
    assert (worker, first.keep, first.hand_to) == (WORKER, True, "")
    monkeypatch.setitem(POLICIES, Policy.TRANSFER, Last())
    worker, first = _first_step(api_settings, api_client, api_redis)
    assert (worker, first.keep, first.hand_to) == (OTHER, True, "")


# -- a toy data plane, both sides --------------------------------------------------------------


class Tally(Plane):
    """The scheduler's side of a plane whose only datum is a count carried in the
    instruction: each step gets the count the step before it made."""

    def instruction(
        self,
        ctx: SchedulerContext,
        run: RunState,
        step: StepRun,
        task_run_id: int,
        queued_at: float,
        *,
        keep: bool,
        hand_to: str = "",
    ) -> Instruction:
        before = step.reads.get(IMAGE)
        count = before.value if before is not None and before.value is not None else 0
        fields = common_fields(ctx, run, step, task_run_id, queued_at)
        return Instruction(**fields, inputs={IMAGE: {"value": count}})

    def received(
        self, ctx: SchedulerContext, run: RunState, step: StepRun, report: Report, sent: Instruction
    ) -> Received:
        if report.status != TaskRunStatus.COMPLETED:
            return Received()
        return Received(made={IMAGE: Datum(value=report.output["count"])})


class TallyWorker:
    """The worker's side: one more than it was given."""

    def run(self, ins: Instruction, call: TaskCall, exe: Execution) -> None:
        exe.output = {"count": ins.inputs[IMAGE]["value"] + 1, "step": ins.ref}


def test_a_toy_data_plane_in_both_tables_runs_a_workflow(
    api_settings: Settings,
    api_client: TestClient,
    api_redis_url: str,
    api_redis: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(PLANES, DataPlane.OBJECT_STORE, Tally())
    # A worker runs each instruction on the plane its mapping names (``worker.planes.PLANES``
    # makes the mapping ``cdiflow worker`` runs with).
    connection = redis.Redis.from_url(api_redis_url)  # a worker reads bytes
    planes = {DataPlane.OBJECT_STORE: TallyWorker()}
    worker = Worker("worker-tally", redis_client=connection, planes=planes,
                    tasks=load_deployed(BUNDLED))  # fmt: skip
    working = threading.Thread(target=worker.run)
    working.start()
    own = make_scheduler(api_settings)
    try:
        poll(lambda: api_redis.exists(keys.worker_key("worker-tally")), "the worker's beat")
        body = {"workflow": "image_pipeline", "input": {"image": IMAGE_URI},
                "data_plane": "object-store"}  # fmt: skip
        started = api_client.post("/api/workflows", json=body)
        assert started.status_code == 201, started.text
        workflow_id = started.json()["id"]

        def finished() -> dict[str, Any] | None:
            own.step()
            run: dict[str, Any] = api_client.get(f"/api/workflows/{workflow_id}").json()
            return run if run["status"] != "RUNNING" and run["status"] != "PENDING" else None

        run = poll(finished, "the run's end")
        assert run["status"] == "COMPLETED", run
        assert run["output"]["count"] == 3  # deblur, denoise, classify: one each
        steps = [t["output"]["step"] for t in run["task_runs"]]
        assert sorted(steps) == ["classify", "deblur", "denoise"]
    finally:
        close_scheduler(own)
        worker.request_stop()
        working.join(timeout=30)
        connection.close()
