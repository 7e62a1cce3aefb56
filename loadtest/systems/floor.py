"""The compute floor: the same operations in ``workers`` plain processes, no orchestration.

Each workflow is ``pipeline_ops.floor_job``: decode the JPEG (already in memory), run the
operations; no S3, no result encoding, no database. The same closed loop as the load test
(``concurrency`` in flight, ``rounds`` each) feeds a process pool as large as the other
systems' worker count, so its latency at high concurrency includes the queueing any system
on these cores must have: the best a system could do here. Not driven through locust: there
is no API to drive, and locust's gevent loop would add its own overhead to the floor.
"""

from __future__ import annotations

import functools
import random
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from pathlib import Path

from loadtest.images import chain_ops
from loadtest.pipeline_ops import floor_job
from loadtest.plan import SEED, Point
from loadtest.stats import WorkflowRecord
from loadtest.systems.base import Inputs, RunContext, System
from workflows.memory import tune_for_images

__all__ = ["FloorSystem"]


@functools.cache
def _image(path: Path) -> bytes:
    return path.read_bytes()


def _job(path: Path, ops: list[str]) -> tuple[float, float, str]:
    return floor_job(_image(path), ops)  # the bytes are read once per process, not timed


class FloorSystem(System):
    name = "floor"

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        self._pool: ProcessPoolExecutor | None = None

    def start(self) -> None:
        # The workers' and the scheduler's memory settings too: the floor is the best case.
        self._pool = ProcessPoolExecutor(self.ctx.workers, initializer=tune_for_images)

    def stop(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def run_point(self, point: Point, inputs: Inputs) -> list[WorkflowRecord]:
        if self._pool is None:
            raise RuntimeError("the floor is not started")
        pool, ops = self._pool, chain_ops(point.tasks)
        for size in point.sizes:  # warm every process's cache: reading a file is not compute
            list(pool.map(_image, [inputs.paths[size]] * self.ctx.workers))
        users = [random.Random(SEED * 100_003 + i) for i in range(point.concurrency)]
        left = {i: point.rounds for i in range(point.concurrency)}
        in_flight: dict[Future[tuple[float, float, str]], tuple[int, int, float]] = {}
        records: list[WorkflowRecord] = []

        def submit(user: int) -> None:
            left[user] -= 1
            size = users[user].choice(point.sizes)
            future = pool.submit(_job, inputs.paths[size], ops)
            in_flight[future] = (user, size, time.time())

        for user in range(point.concurrency):
            submit(user)
        while in_flight:
            done, _ = wait(list(in_flight), return_when=FIRST_COMPLETED)
            for future in done:
                user, size, submitted = in_flight.pop(future)
                try:
                    _, finished, _ = future.result()
                    records.append(
                        WorkflowRecord(
                            self.name, size, point.tasks, submitted, finished, "COMPLETED"
                        )
                    )
                except Exception as exc:
                    records.append(
                        WorkflowRecord(
                            self.name, size, point.tasks, submitted, None, "FAILED", repr(exc)
                        )
                    )
                if left[user] > 0:
                    submit(user)
        return records
