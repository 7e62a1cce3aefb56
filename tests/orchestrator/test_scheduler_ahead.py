"""A join's input that a worker held ahead of the join, returned to the scheduler by the
minion's recovery rule when that worker's process ended: taken back once a heartbeat shows the
restart, and moved on to the join's worker with the join; or, when the join was placed there
before any heartbeat said so and failed for the input never given to it, moved with the join's
next attempt, that attempt lost, not the task's. The scheduler is driven by hand against real
Postgres and Redis, with the worker's heartbeat written by the test and a minion that says who
owns each object and records every move (an end-to-end test kills a real worker:
``test_e2e_graphs.test_a_worker_killed_holding_a_joins_input_has_the_join_run_elsewhere``)

A share a worker holds for a branch it has not run yet is held ahead of that branch too: a
branch given up unrun (its live worker slow, or its heartbeat late) has its share asked back,
or the fork's last read, which takes the object over, is refused for as long as the worker
lives (a run stuck RUNNING in the chaos case of a scheduler killed while a join's input was
held)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

import cdi
from cdi import ObjectKey
from orchestrator.contract import keys
from orchestrator.contract.messages import Instruction, Report
from orchestrator.contract.vocabulary import TaskRunStatus
from orchestrator.scheduler.dispatch import BEATS_TTL_S
from orchestrator.scheduler.loop import Scheduler
from orchestrator.settings import Settings
from tests.orchestrator.scheduler_support import (
    WORKER,
    Handle,
    MinionUp,
    beat,
    close_scheduler,
    make_scheduler,
    store_definition,
)

DIAMOND: list[dict[str, Any]] = [
    {"ref": "a", "task": "deblur"},
    {"ref": "b1", "task": "deblur", "inputs": {"image": "a.image"}},
    {"ref": "b2", "task": "denoise", "inputs": {"image": "a.image"}},
    {"ref": "c", "task": "blend", "inputs": {"sharp": "b1.image", "smooth": "b2.image"}},
]


class _Moved(Handle):
    def __init__(self, key: str, minion: _Minion) -> None:
        super().__init__(key)
        self.minion = minion

    def transfer(self, worker: str) -> None:
        self.minion.moves.append((self.key, worker))
        self.minion.owners[self.key] = worker

    def share(self, workers: list[str]) -> None:
        pass


class _Minion(MinionUp):
    """Owners as the test sets them; every transfer recorded."""

    def __init__(self) -> None:
        self.owners: dict[str, str] = {}
        self.moves: list[tuple[str, str]] = []

    def list_objects(self) -> list[Any]:
        return [{"key": k, "owner": o} for k, o in self.owners.items()]

    def use(self, key: str, *, check: bool = True) -> _Moved:
        return _Moved(key, self)

    def whereabouts(self, key: str) -> None:
        return None


@dataclass
class _Stage:
    scheduler: Scheduler
    minion: _Minion
    api: TestClient
    sessions: sessionmaker[Session]
    redis: redis.Redis


@pytest.fixture
def stage(
    api_settings: Settings,
    api_client: TestClient,
    api_sessions: sessionmaker[Session],
    api_redis: redis.Redis,
) -> Iterator[_Stage]:
    minion = _Minion()
    own = make_scheduler(api_settings, cdi=minion)
    try:
        yield _Stage(own, minion, api_client, api_sessions, api_redis)
    finally:
        close_scheduler(own)


def _popped(api_redis: redis.Redis) -> list[Instruction]:
    queue = keys.worker_queue_key(WORKER)
    raws = [str(raw) for raw in reversed(api_redis.lrange(queue, 0, -1))]
    return [Instruction.loads(raw) for raw in raws if api_redis.lrem(queue, 1, raw)]


def _report(scheduler: Scheduler, api_redis: redis.Redis, report: Report) -> None:
    api_redis.lpush(scheduler.reply_key, report.dumps())
    scheduler.step()


def _done(ins: Instruction, *, kept: bool) -> Report:
    now = time.time()
    return Report(ins.task_run_id, ins.workflow_id, WORKER, TaskRunStatus.COMPLETED,
                  now - 0.1, now, key=ins.output_key, kept=kept,
                  bytes_in=1000, bytes_out=1000)  # fmt: skip


def _branches_out(stage: _Stage) -> tuple[str, dict[str, Instruction]]:
    """The diamond started under ``transfer`` on the one worker, ``a`` done: the run's id and
    both branches' instructions."""
    scheduler, minion, api_redis = stage.scheduler, stage.minion, stage.redis
    beat(api_redis, started_at=1000.0)
    api_redis.delete(keys.worker_queue_key(WORKER))
    name = store_definition(stage.sessions, DIAMOND)
    body = {"workflow": name, "input": {"image": "s3://cdiflow/images/any.jpg"},
            "policy": "transfer"}  # fmt: skip
    started = stage.api.post("/api/workflows", json=body)
    assert started.status_code == 201, started.text
    scheduler.claims.claim()
    [a] = _popped(api_redis)
    minion.owners[a.output_key] = scheduler.id  # a fork's object comes back
    _report(scheduler, api_redis, _done(a, kept=False))
    branches = {i.ref: i for i in _popped(api_redis)}
    assert sorted(branches) == ["b1", "b2"]
    assert all(i.keep for i in branches.values())  # one worker: the join's, so kept
    return str(started.json()["id"]), branches


def test_a_join_input_held_by_a_worker_that_restarted_is_taken_back_and_moved_on(
    stage: _Stage,
) -> None:
    """``b1`` kept its image for the join; the worker restarts (its heartbeat says so) while
    ``b2`` runs there. ``b2`` is lost and runs again; the image, back with the scheduler by
    the minion's recovery rule, is the scheduler's again, and goes to the join's worker with
    the join."""
    workflow_id, branches = _branches_out(stage)
    scheduler, minion, api_redis = stage.scheduler, stage.minion, stage.redis
    b1, b2 = branches["b1"], branches["b2"]
    minion.owners[b1.output_key] = WORKER
    _report(scheduler, api_redis, _done(b1, kept=True))
    assert _popped(api_redis) == []  # the join waits for b2

    minion.owners[b1.output_key] = scheduler.id  # the recovery rule, as its process ended
    beat(api_redis, started_at=1001.0)
    time.sleep(BEATS_TTL_S * 2)  # the scheduler re-reads heartbeats at most this often
    scheduler.recovery.check_in_flight()
    again: list[Instruction] = []
    deadline = time.monotonic() + 10.0
    while not again and time.monotonic() < deadline:
        scheduler.step()  # b2's retry goes out after its backoff
        again = _popped(api_redis)
    assert [i.ref for i in again] == ["b2"], "b2 did not go out again"
    assert again[0].key and minion.moves == [(again[0].key, WORKER)]  # a's image, its last read
    minion.moves.clear()
    minion.owners[again[0].output_key] = WORKER
    _report(scheduler, api_redis, _done(again[0], kept=True))
    [c] = _popped(api_redis)
    assert c.ref == "c"
    assert minion.moves == [(b1.output_key, WORKER)]  # given to the join's worker
    detail = stage.api.get(f"/api/workflows/{workflow_id}").json()
    moved = [(h["datum"], h["from_container"], h["to_container"]) for h in detail["handoffs"]]
    assert ("b1.image", scheduler.id, WORKER) in moved, moved
    assert b2.task_run_id != again[0].task_run_id


def test_a_join_failing_for_an_input_its_worker_lost_unseen_goes_out_again_with_it(
    stage: _Stage,
) -> None:
    """The worker's process ended and came back before any heartbeat said so: the join,
    placed where its inputs were kept, fails for the one the minion returned to the
    scheduler, and goes out again with it, that attempt lost, not the task's."""
    workflow_id, branches = _branches_out(stage)
    scheduler, minion, api_redis = stage.scheduler, stage.minion, stage.redis
    for ins in branches.values():
        minion.owners[ins.output_key] = WORKER
        _report(scheduler, api_redis, _done(ins, kept=True))
    [c] = _popped(api_redis)
    assert c.ref == "c" and minion.moves == []  # pinned where its inputs are kept

    lost = branches["b1"].output_key
    minion.owners[lost] = scheduler.id
    now = time.time()
    failed = Report(c.task_run_id, workflow_id, WORKER, TaskRunStatus.FAILED, now, now,
                    error=f"CDI object {lost!r} was not given to {WORKER} within 5 s")  # fmt: skip
    _report(scheduler, api_redis, failed)

    again: list[Instruction] = []
    deadline = time.monotonic() + 10.0
    while not again and time.monotonic() < deadline:
        scheduler.step()  # the retry goes out after its backoff
        again = _popped(api_redis)
    assert [i.ref for i in again] == ["c"], "the join did not go out again"
    assert minion.moves == [(lost, WORKER)]  # this time the image is given to it
    detail = stage.api.get(f"/api/workflows/{workflow_id}").json()
    assert detail["status"] == "RUNNING", detail["error"]
    runs = [r for r in detail["task_runs"] if r["ref"] == "c"]
    assert [r["status"] for r in runs] == ["FAILED", "QUEUED"], runs
    run = scheduler.runs[uuid.UUID(workflow_id)]
    assert run.steps["c"].lost == 1  # the worker's loss, not the task's: no retry spent


# ---------------------------------------------------------------------- a share given up unrun

WORKER2 = f"{WORKER}-2"

# The chaos graph's shape: ``a``'s image read by three steps, shared with the first two (``b``,
# ``n``) and taken over by the last (``s``, after ``n``); ``c`` joins ``s`` and ``b``.
FORK3: list[dict[str, Any]] = [
    {"ref": "a", "task": "deblur"},
    {"ref": "b", "task": "denoise", "inputs": {"image": "a.image"}},
    {"ref": "n", "task": "sleep", "inputs": {"image": "a.image"}},
    {"ref": "s", "task": "deblur", "inputs": {"image": "a.image"}, "depends_on": ["n"]},
    {"ref": "c", "task": "blend", "inputs": {"sharp": "s.image", "smooth": "b.image"}},
]


class _Shared(_Moved):
    """An object its owner may not hand over while a reader holds a share of it, as the
    minion refuses (``ObjectShared``)."""

    def __init__(self, key: str, minion: _Sharing) -> None:
        super().__init__(key, minion)
        self.sharing = minion

    def transfer(self, worker: str) -> None:
        readers = self.sharing.shares.get(self.key)
        if readers:
            raise cdi.ObjectShared(f"{self.key!r} is shared with {sorted(readers)}")
        super().transfer(worker)

    def share(self, workers: list[str]) -> None:
        self.sharing.shares.setdefault(self.key, set()).update(workers)


class _Sharing(_Minion):
    """``_Minion`` that keeps each reader's share until that reader gives it up."""

    def __init__(self) -> None:
        super().__init__()
        self.shares: dict[str, set[str]] = {}

    def use(self, key: str, *, check: bool = True) -> _Shared:
        return _Shared(key, self)

    def run(self, ins: Instruction, worker: str) -> list[str]:
        """``worker`` ran ``ins`` (a task, or a hand-back): it gave up the shares it read
        through; those keys."""
        read = [str(d["key"]) for d in ins.inputs.values()
                if isinstance(d, dict) and d.get("mode") == "read"]  # fmt: skip
        for key in read:
            self.shares.get(key, set()).discard(worker)
        return read


def _peek(api_redis: redis.Redis) -> list[tuple[str, str, Instruction]]:
    """(worker, raw, instruction) queued at both workers, oldest first."""
    found = []
    for worker in (WORKER, WORKER2):
        for raw in reversed(api_redis.lrange(keys.worker_queue_key(worker), 0, -1)):
            found.append((worker, str(raw), Instruction.loads(raw)))
    return found


def _take(api_redis: redis.Redis, ref: str) -> tuple[str, Instruction] | None:
    """Pop the instruction of step ``ref`` from whichever worker's queue has it."""
    for worker, raw, ins in _peek(api_redis):
        if ins.ref == ref and api_redis.lrem(keys.worker_queue_key(worker), 1, raw):
            return worker, ins
    return None


def _ran(
    scheduler: Scheduler, api_redis: redis.Redis, minion: _Sharing, worker: str, ins: Instruction
) -> None:
    """``worker`` ran ``ins`` and reports it: its shares given up, what it made kept, handed
    on or handed back as the instruction said."""
    released = minion.run(ins, worker)
    made = ins.output_key
    if made:
        minion.owners[made] = worker if ins.keep else (ins.hand_to or scheduler.id)
    now = time.time()
    report = Report(
        ins.task_run_id, ins.workflow_id, worker, TaskRunStatus.COMPLETED, now - 0.1, now,
        key=made, kept=ins.keep, handed_to="" if ins.keep else ins.hand_to,
        released=[ObjectKey(k) for k in released], bytes_in=1000, bytes_out=1000,
    )  # fmt: skip
    _report(scheduler, api_redis, report)


def _beat_both(api_redis: redis.Redis) -> None:
    for worker in (WORKER, WORKER2):
        beat(api_redis, started_at=1000.0, worker=worker)


def _wait_for(
    scheduler: Scheduler, api_redis: redis.Redis, ref: str, wait_s: float = 8.0
) -> tuple[str, Instruction] | None:
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        _beat_both(api_redis)
        taken = _take(api_redis, ref)
        if taken is not None:
            return taken
        scheduler.step()
    return None


def test_a_shared_read_given_up_before_its_worker_ran_it_gives_the_share_back(
    api_settings: Settings,
    api_client: TestClient,
    api_sessions: sessionmaker[Session],
    api_redis: redis.Redis,
) -> None:
    """A fork's object is shared with each branch's worker as the branch goes out. ``n`` waits
    in its live worker's queue past its deadline and is given up, taken off that queue unrun:
    the share it was given must be asked back, or that worker holds it for as long as it
    lives and the object's last read (``s``, which takes the object over) is refused every
    time (``ObjectShared``): the run stays RUNNING with nothing out, holding the fork's object
    and ``b``'s image ahead of the join."""
    minion = _Sharing()
    own = make_scheduler(api_settings, cdi=minion)
    try:
        for worker in (WORKER, WORKER2):
            api_redis.delete(keys.worker_queue_key(worker))
        _beat_both(api_redis)
        name = store_definition(api_sessions, FORK3)
        body = {"workflow": name, "input": {"image": "s3://cdiflow/images/any.jpg"},
                "policy": "transfer"}  # fmt: skip
        started = api_client.post("/api/workflows", json=body)
        assert started.status_code == 201, started.text
        workflow_id = uuid.UUID(started.json()["id"])
        own.claims.claim()
        taken = _take(api_redis, "a")
        assert taken is not None, "a did not go out"
        _ran(own, api_redis, minion, *taken)
        fork = taken[1].output_key
        queued = {ins.ref: worker for worker, _, ins in _peek(api_redis)}
        assert sorted(queued) == ["b", "n"], queued  # both branches, each with a share
        assert set(queued.values()) <= minion.shares[fork]
        taken = _take(api_redis, "b")
        assert taken is not None
        _ran(own, api_redis, minion, *taken)

        # n is still in its worker's queue when its deadline passes: given up, taken off.
        holder = queued["n"]
        step = own.runs[workflow_id].steps["n"]
        assert step.in_flight is not None
        step.in_flight = replace(step.in_flight, deadline=0.0)
        _beat_both(api_redis)
        time.sleep(BEATS_TTL_S * 2)  # the scheduler re-reads heartbeats at most this often
        own.recovery.check_in_flight()
        # The worker (alive, only slow) runs what is left in its queue.
        for worker, raw, ins in _peek(api_redis):
            if worker == holder and api_redis.lrem(keys.worker_queue_key(worker), 1, raw):
                assert ins.ref == "release", f"{ins.ref} was not taken off {worker}'s queue"
                minion.run(ins, worker)

        again = _wait_for(own, api_redis, "n")
        assert again is not None, "n did not go out again"
        assert again[0] != holder  # elsewhere: its first worker lost it
        _ran(own, api_redis, minion, *again)
        last = _wait_for(own, api_redis, "s")
        assert last is not None, (
            f"s did not go out: {fork!r} is still shared with {sorted(minion.shares[fork])}"
        )
        assert (fork, last[0]) in minion.moves  # the fork's object, taken over by s
    finally:
        close_scheduler(own)
