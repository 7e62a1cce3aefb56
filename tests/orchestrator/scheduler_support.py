"""The scheduler driven by hand in tests: a real one on the API tests' Postgres and Redis, with a
worker's heartbeat written by the test (``tests/orchestrator/test_scheduler_*.py``)."""

from __future__ import annotations

import time
import uuid
from typing import Any

import redis
from sqlalchemy.orm import Session, sessionmaker

from orchestrator.contract import keys
from orchestrator.db.engine import make_engine
from orchestrator.db.models import WorkflowDefinition, WorkflowDefinitionVersion
from orchestrator.db.scheduler_liveness import SchedulerLiveness
from orchestrator.db.scheduler_store import SchedulerStore
from orchestrator.objectstore import ObjectStore
from orchestrator.scheduler.loop import Scheduler, connect_redis
from orchestrator.settings import Settings
from workflows.loader import load_deployed
from workflows.sources import BUNDLED

WORKER = "worker-race"


class NoCDI:
    """Dataless workflows move no objects, and the scheduler makes no object of a CDI run's
    input: any call to the minion here is a bug in the test's premise. Which host the
    minion is on (known without a call) is all it may read."""

    host = "test"

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"a dataless workflow must not call cdi.{name}")


class MinionUp(NoCDI):
    """The loop's own checks between steps: the minion has not restarted and holds no
    object. Everything else (``use``, ``transfer``, ...) still fails."""

    def check(self) -> bool:
        return False

    def list_objects(self) -> list[Any]:
        return []


class Handle:
    """A CDI object as the scheduler's moves see it: every hand-over succeeds."""

    def __init__(self, key: str) -> None:
        self.key = key

    def transfer(self, worker: str) -> None:
        pass

    def access(self, timeout: float | None = None) -> Handle:
        return self

    def release(self) -> None:
        pass

    def destroy(self) -> None:
        pass


class MinionHands(MinionUp):
    """A minion that takes every hand-over and destroy, for a test of what the scheduler does
    around them (an end-to-end test runs a real one)."""

    def use(self, key: str, *, check: bool = True) -> Handle:
        return Handle(key)


def beat(
    client: redis.Redis,
    started_at: float,
    *,
    worker: str = WORKER,
    queue_depth: int = 0,
    ahead_s: float = 0.0,
) -> None:
    """A live worker's heartbeat, as ``orchestrator.worker.heartbeat`` writes it; ``ahead_s``
    stamps it that much later than now (a beat sent after a report the test is about to
    hand the scheduler: the scheduler ignores the queue of a beat older than a report)."""
    fields = {
        "cpu": "1.0",
        "mem": "10.0",
        "queue_depth": str(queue_depth),
        "running": "0",
        "slots": "1",
        "host": "test",
        "last_heartbeat": f"{time.time() + ahead_s:.3f}",
        "started_at": f"{started_at:.3f}",
        "held_images": "0",
        "held_bytes": "0",
        "tasks": load_deployed(BUNDLED).to_json(),  # the bundled tasks only
        "proc_cpu": "0.5",
        "proc_rss": "104857600",
        "proc_mem": "0.5",
        **{f"input_cache_{name}": "" for name in ("hits", "misses", "saved_bytes", "s3_bytes",
                                                   "holder", "entries", "bytes")},  # off
    }  # fmt: skip
    assert tuple(fields) == keys.WORKER_FIELDS
    client.hset(keys.worker_key(worker), mapping=fields)  # type: ignore[arg-type]
    client.sadd(keys.WORKERS, worker)


def store_definition(sessions: sessionmaker[Session], steps: list[dict[str, Any]]) -> str:
    """A definition written straight into the tables (as one stored long ago would be)."""
    name = f"graph_{uuid.uuid4().hex[:8]}"
    with sessions() as session, session.begin():
        session.add(WorkflowDefinition(name=name, tasks=steps, version=1))
        session.flush()
        session.add(WorkflowDefinitionVersion(name=name, version=1, tasks=steps))
    return name


def make_scheduler(
    settings: Settings,
    scheduler_id: str | None = None,
    *,
    cdi: Any = None,
    reconciled: bool = False,
) -> Scheduler:
    """A scheduler as the command line makes it (``close_scheduler`` ends it)."""
    assert settings.database_url and settings.redis_url
    engine = make_engine(settings.database_url)
    name = scheduler_id or f"scheduler-{uuid.uuid4().hex[:8]}"
    return Scheduler(
        name,
        settings,
        SchedulerStore(engine),
        connect_redis(settings.redis_url),
        cdi if cdi is not None else NoCDI(),  # type: ignore[arg-type]
        ObjectStore(settings),
        liveness=SchedulerLiveness(engine, name, dead_after_s=0.0) if reconciled else None,
    )


def close_scheduler(own: Scheduler) -> None:
    """Stop the scheduler and close its connections, as its process ending would."""
    own.stop()
    own.db.close()
    if own.liveness is not None:
        own.liveness.close()
    own.redis.close()
    own.db._engine.dispose()
