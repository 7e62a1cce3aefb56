"""The compute floor: the same operations in ``workers`` plain processes, no orchestration.

``floor``: each workflow is ``pipeline_ops.floor_job``: decode the JPEG (already in memory),
run the operations; no S3, no result encoding, no database. ``floor-s3``: the same, plus what
every system's workflow does besides its operations and orchestration: GET its input from S3
and encode and PUT its result (``pipeline_ops.floor_s3_job``), so the difference between a
system and ``floor-s3`` is its orchestration alone, and ``floor-s3``'s share of ``floor`` is
the most any system storing its results through the same endpoint can reach here.

The same closed loop as the load test (``concurrency`` in flight, ``rounds`` each) feeds a
process pool as large as the other systems' worker count, so its latency at high concurrency
includes the queueing any system on these cores must have: the best a system could do here.
Not driven through locust: there is no API to drive, and locust's gevent loop would add its
own overhead to the floor.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import random
import time
import uuid
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from pathlib import Path

from loadtest.images import chain_ops
from loadtest.pipeline_ops import FloorRun, floor_job, floor_s3_job
from loadtest.plan import SEED, Point
from loadtest.stats import WorkflowRecord
from loadtest.systems.base import Inputs, RunContext, System
from loadtest.systems.services import BenchServices, clear_prefixes, peer_env
from workflows.memory import tune_for_images

__all__ = ["FloorSystem"]


@functools.cache
def _image(path: Path) -> bytes:
    return path.read_bytes()


PREFIX = "floor-s3/"  # the results ``floor-s3`` stores, cleared after each point


def _job(path: Path, ops: list[str]) -> FloorRun:
    return floor_job(_image(path), ops)  # the bytes are read once per process, not timed


def _s3_job(uri: str, ops: list[str]) -> FloorRun:
    return floor_s3_job(uri, ops, f"{PREFIX}{uuid.uuid4().hex}")


def _init_process(env: dict[str, str]) -> None:
    os.environ.update(env)  # S3 as the systems reach it, for ``pipeline_ops.task_store``
    tune_for_images()  # the workers' memory settings: the best case


class FloorSystem(System):
    """``floor``, or with ``services`` ``floor-s3``."""

    def __init__(self, ctx: RunContext, services: BenchServices | None = None) -> None:
        self.ctx = ctx
        self.services = services
        self.name = "floor" if services is None else "floor-s3"
        self._pool: ProcessPoolExecutor | None = None

    def start(self) -> None:
        env = peer_env(self.services) if self.services is not None else {}
        # Spawned, not forked: the benchmark (or the test process running it) has native
        # threads (gRPC's, the S3 client's runtime) that a fork copies half-way; a suite run
        # crashed in one.
        self._pool = ProcessPoolExecutor(
            self.ctx.workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_init_process,
            initargs=(env,),
        )

    def after_point(self) -> None:
        if self.services is not None:
            clear_prefixes(self.services.running, (PREFIX,))

    def stop(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def run_point(self, point: Point, inputs: Inputs) -> list[WorkflowRecord]:
        if self._pool is None:
            raise RuntimeError("the floor is not started")
        pool, ops = self._pool, chain_ops(point.tasks)
        if self.services is None:
            for size in point.sizes:  # warm every process's cache: reading is not compute
                list(pool.map(_image, [inputs.paths[size]] * self.ctx.workers))
        users = [random.Random(SEED * 100_003 + i) for i in range(point.concurrency)]
        left = {i: point.rounds for i in range(point.concurrency)}
        in_flight: dict[Future[FloorRun], tuple[int, int, float]] = {}
        records: list[WorkflowRecord] = []

        def submit(user: int) -> None:
            left[user] -= 1
            size = users[user].choice(point.sizes)
            if self.services is None:
                future = pool.submit(_job, inputs.paths[size], ops)
            else:
                future = pool.submit(_s3_job, inputs.uris[size], ops)
            in_flight[future] = (user, size, time.time())

        for user in range(point.concurrency):
            submit(user)
        while in_flight:
            done, _ = wait(list(in_flight), return_when=FIRST_COMPLETED)
            for future in done:
                user, size, submitted = in_flight.pop(future)
                try:
                    run = future.result()
                    records.append(
                        WorkflowRecord(
                            self.name,
                            size,
                            point.tasks,
                            submitted,
                            run.finished,
                            "COMPLETED",
                            ops_cpu_ms=run.ops_cpu_ms,
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
