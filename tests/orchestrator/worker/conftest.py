"""The worker tests' fixtures: a minion, Redis and S3 for each module (``support.Stack``), a
worker its tests share, and an S3 client."""

from __future__ import annotations

import os
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis

import cdi
from cdi.minion.process import MinionChild
from tests.orchestrator.worker.support import (
    BUCKET,
    SCHEDULER,
    WORKER_REDIS_DB,
    Stack,
    WorkerProcess,
)


@pytest.fixture(scope="module")
def stack(redis_url: str, s3_endpoint: str, s3_keys: tuple[str, str]) -> Iterator[Stack]:
    with tempfile.TemporaryDirectory(prefix="cdiflow-worker-test-") as name:
        os.chmod(name, 0o755)  # the minion's socket folder, traversable like in production
        tmp = Path(name)
        minion = MinionChild(str(tmp / "minion.sock")).start()
        db_url = urlunsplit(urlsplit(redis_url)._replace(path=f"/{WORKER_REDIS_DB}"))
        r = redis.Redis.from_url(db_url)
        r.flushdb()
        sched = cdi.connect(minion.socket_path, SCHEDULER)
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CDI_SOCKET")}
        env |= {
            "CDI_URL": f"unix://{minion.socket_path}", "REDIS_URL": db_url,
            "S3_ENDPOINT_URL": s3_endpoint, "S3_BUCKET": BUCKET, "AWS_REGION": "us-east-1",
            "AWS_ACCESS_KEY_ID": s3_keys[0], "AWS_SECRET_ACCESS_KEY": s3_keys[1],
            "CDIFLOW_DATA_DIR": str(tmp / "data"),
            "CDIFLOW_TASK_PACKAGES": "workflows,tests.orchestrator",
            # The tests' results and in-between images go under worker-test/.
            "CDIFLOW_S3_RESULTS": f"s3://{BUCKET}/worker-test/",
        }  # fmt: skip
        running = Stack(env, r, sched, tmp)
        try:
            yield running
            for worker in running.workers:
                if worker.proc.poll() is None:
                    worker.proc.send_signal(signal.SIGTERM)
                    assert worker.wait() == 0, worker.log()
            # Every object came back to the scheduler and was destroyed by the tests.
            assert sched.list_objects() == []
        finally:
            for worker in running.workers:
                worker.kill()
            sched.close()
            r.flushdb()
            r.close()
            minion.stop()


@pytest.fixture(scope="module")
def worker(stack: Stack) -> WorkerProcess:
    """A worker shared by the tests that leave it running."""
    return stack.start_worker()
