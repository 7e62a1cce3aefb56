"""Under ``auto`` a worker keeps what a step of a chain makes while the next step is predicted
to stay on it, and that step is then pinned there: the object goes neither back to the
scheduler nor out again. Otherwise (and under ``transfer`` whenever the next step's predicted
worker is another) it goes straight to the next step's worker, where that step is pinned. The
scheduler is driven by hand against real Postgres and Redis, with the workers' heartbeats
written by the test; its CDI client only answers that the minion is up and holds nothing
(``MinionUp``), so any move of an object would fail the test."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, TypeVar

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

if TYPE_CHECKING:
    from _typeshed import SupportsLenAndGetItem

OTHER = "worker-other"
_T = TypeVar("_T")
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
    return _done(ins, WORKER, kept=True)


def _done(ins: Instruction, worker: str, *, kept: bool = False, handed_to: str = "") -> Report:
    """``ins`` done by ``worker``, its new image kept there or handed on to ``handed_to``."""
    now = time.time()
    return Report(ins.task_run_id, ins.workflow_id, worker, TaskRunStatus.COMPLETED,
                  now - 0.1, now, key=ins.output_key, kept=kept, handed_to=handed_to,
                  bytes_in=1_000_000, bytes_out=1_000_000)  # fmt: skip


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
        # cost more than moving 1 MB to the idle worker; the object goes straight there.
        assert (second.keep, second.hand_to) == (False, OTHER)
    finally:
        api_redis.srem(keys.WORKERS, OTHER)
        api_redis.delete(keys.worker_key(OTHER))


class _TiesAlternate(random.Random):
    """Breaks ties first one way, then the other: the step's worker and the worker predicted
    for the next step differ whenever they tie."""

    def __init__(self) -> None:
        super().__init__()
        self.turn = 0

    def choice(self, seq: SupportsLenAndGetItem[_T]) -> _T:
        self.turn += 1
        return seq[0] if self.turn % 2 else seq[-1]


def _pushed_to_either(api_redis: redis.Redis) -> tuple[str, Instruction]:
    for worker in (WORKER, OTHER):
        if api_redis.llen(keys.worker_queue_key(worker)):
            return worker, _pushed(api_redis, worker)
    raise AssertionError("no instruction was pushed")


def test_transfer_hands_the_image_on_to_the_next_steps_worker_or_keeps_it_there(
    scheduler: Scheduler, api_client: TestClient, api_redis: redis.Redis
) -> None:
    """Under ``transfer`` the next step's worker is chosen when a step is sent: the step's
    worker keeps what it makes when that is itself, and hands it straight on otherwise. The
    next step then goes where the object is, and the scheduler moves nothing (its CDI client
    fails any move): one hand-off, from worker to worker."""
    for worker in (WORKER, OTHER):
        api_redis.delete(keys.worker_queue_key(worker))
    beat(api_redis, started_at=1000.0)
    beat(api_redis, started_at=1000.0, worker=OTHER)
    scheduler.dispatch._rng = _TiesAlternate()
    try:
        # Both idle: they tie for the first step, and again for the prediction.
        handed_id = _start(api_client, "transfer")
        scheduler.claims.claim()
        at, first = _pushed_to_either(api_redis)
        to = OTHER if at == WORKER else WORKER
        assert (first.ref, first.keep, first.hand_to, first.hold) == ("deblur", False, to, False)
        # One task out at ``at`` now: the next run's first step goes to ``to``, and so would
        # its next step: ``to`` keeps what it makes.
        kept_id = _start(api_client, "transfer")
        scheduler.claims.claim()
        where, kept = _pushed_to_either(api_redis)
        assert (where, kept.workflow_id, kept.keep, kept.hand_to) == (to, kept_id, True, "")

        api_redis.lpush(scheduler.reply_key, _done(first, at, handed_to=to).dumps())
        scheduler.step()
        second = _pushed(api_redis, to)
        assert (second.workflow_id, second.ref) == (handed_id, "denoise")
        assert (second.key, second.input_uri) == (first.output_key, "")
        assert api_redis.llen(keys.worker_queue_key(at)) == 0
        handoffs = api_client.get(f"/api/workflows/{handed_id}").json()["handoffs"]
        moved = [(h["from_container"], h["to_container"], h["mode"]) for h in handoffs]
        assert moved == [(at, to, "transfer")]
    finally:
        api_redis.srem(keys.WORKERS, OTHER)
        api_redis.delete(keys.worker_key(OTHER))


def test_affinity_always_keeps(
    scheduler: Scheduler, api_client: TestClient, api_redis: redis.Redis
) -> None:
    api_redis.delete(keys.worker_queue_key(WORKER))
    beat(api_redis, started_at=1000.0)
    workflow_id = _start(api_client, "affinity")
    scheduler.claims.claim()
    first = _pushed(api_redis, WORKER)
    assert first.workflow_id == workflow_id
    assert (first.keep, first.hand_to) == (True, "")
