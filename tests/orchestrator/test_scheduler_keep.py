"""Under ``auto`` a worker keeps what a step of a chain makes while the next step is predicted
to stay on it, and that step is then pinned there: the object goes neither back to the
scheduler nor out again. The scheduler is driven by hand against real Postgres and Redis, with
the workers' heartbeats written by the test; its CDI client only answers that the minion is up
and holds nothing (``MinionUp``), so any move of an object would fail the test."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis
from fastapi.testclient import TestClient

from orchestrator.contract import keys
from orchestrator.contract.messages import Instruction, Report
from orchestrator.contract.vocabulary import TaskRunStatus
from orchestrator.scheduler.dispatch import BEATS_TTL_S
from orchestrator.scheduler.loop import Scheduler
from orchestrator.settings import Settings
from tests.orchestrator.scheduler_support import (
    WORKER,
    MinionUp,
    beat,
    close_scheduler,
    make_scheduler,
)

OTHER = "worker-other"
IMAGE = "s3://cdiflow/images/any.jpg"


@pytest.fixture
def scheduler(api_settings: Settings, api_client: TestClient) -> Iterator[Scheduler]:
    own = make_scheduler(api_settings, cdi=MinionUp())
    try:
        yield own
    finally:
        close_scheduler(own)


def _pushed(api_redis: redis.Redis, worker: str) -> Instruction:
    raw = api_redis.rpop(keys.worker_queue_key(worker))
    assert isinstance(raw, bytes | str), f"no instruction was pushed to {worker}"
    return Instruction.loads(raw)


def _kept(ins: Instruction) -> Report:
    """``ins`` done, its new image kept by the worker (as a worker reports a ``keep``)."""
    now = time.time()
    return Report(ins.task_run_id, ins.workflow_id, WORKER, TaskRunStatus.COMPLETED,
                  now - 0.1, now, key=ins.output_key, kept=True, bytes_in=1_000_000,
                  bytes_out=1_000_000)  # fmt: skip


def _start(api_client: TestClient, policy: str) -> str:
    body = {"workflow": "image_pipeline", "input": {"image": IMAGE}, "policy": policy}
    started = api_client.post("/api/workflows", json=body)
    assert started.status_code == 201, started.text
    return str(started.json()["id"])


def test_auto_keeps_the_image_on_its_worker_while_the_next_step_is_predicted_to_stay(
    scheduler: Scheduler, api_client: TestClient, api_redis: redis.Redis
) -> None:
    for worker in (WORKER, OTHER):
        api_redis.delete(keys.worker_queue_key(worker))
    beat(api_redis, started_at=1000.0)
    beat(api_redis, started_at=1000.0, worker=OTHER, queue_depth=3)
    try:
        workflow_id = _start(api_client, "auto")
        scheduler.claims.claim()
        first = _pushed(api_redis, WORKER)  # the idle one
        assert first.workflow_id == workflow_id and first.ref == "deblur"
        # The other worker has three tasks queued: the next step would stay here; keep.
        assert first.keep

        # The next step goes to the worker that kept the object, with no move (no CDI call),
        # although the worker that kept it is now the busier one ...
        beat(api_redis, started_at=1000.0, queue_depth=8, ahead_s=5.0)
        beat(api_redis, started_at=1000.0, worker=OTHER)
        time.sleep(BEATS_TTL_S * 2)  # the scheduler re-reads heartbeats at most this often
        api_redis.lpush(scheduler.reply_key, _kept(first).dumps())
        scheduler.step()
        second = _pushed(api_redis, WORKER)
        assert (second.ref, second.key, second.input_uri) == ("denoise", first.output_key, "")
        assert api_redis.llen(keys.worker_queue_key(OTHER)) == 0
        # ... so it does not keep what this step makes: eight tasks ahead of the next step
        # cost more than moving 1 MB to the idle worker; the object comes back.
        assert not second.keep
    finally:
        api_redis.srem(keys.WORKERS, OTHER)
        api_redis.delete(keys.worker_key(OTHER))


def test_transfer_never_keeps_and_affinity_always_does(
    scheduler: Scheduler, api_client: TestClient, api_redis: redis.Redis
) -> None:
    api_redis.delete(keys.worker_queue_key(WORKER))
    beat(api_redis, started_at=1000.0)
    for policy, keeps in (("transfer", False), ("affinity", True)):
        workflow_id = _start(api_client, policy)
        scheduler.claims.claim()
        first = _pushed(api_redis, WORKER)
        assert first.workflow_id == workflow_id
        assert first.keep is keeps, policy
