"""The compute floor: the same operations in ``workers`` plain processes, no orchestration.

``floor``: each workflow is ``pipeline_ops.floor_job``: decode the JPEG (already in memory),
run the operations; no S3, no result encoding, no database. ``floor-s3``: the same, plus what
every system's workflow does besides its operations and orchestration: GET its input from S3
and encode and PUT its result (``pipeline_ops.floor_s3_job``), so the difference between a
system and ``floor-s3`` is its orchestration alone, and ``floor-s3``'s share of ``floor`` is
the most any system storing its results through the same endpoint can reach here.

The same closed loop as the load test (``concurrency`` in flight, ``rounds`` each), or its
open loop (``loadtest.arrivals``), feeds a process pool as large as the other systems'
worker count, so its latency at high concurrency includes the queueing any system on these
cores must have: the best a system could do here.
Not driven through locust: there is no API to drive, and locust's gevent loop would add its
own overhead to the floor.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import time
import uuid
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from pathlib import Path

from loadtest.arrivals import Arrivals
from loadtest.images import chain_ops
from loadtest.pipeline_ops import FloorRun, floor_job, floor_s3_job, prepare_worker_process
from loadtest.plan import SEED, Point
from loadtest.stats import WorkflowRecord
from loadtest.systems.base import Inputs, RunContext, System
from loadtest.systems.services import BenchServices, clear_prefixes, peer_env

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
    prepare_worker_process()  # the memory settings every system's workers run with


class FloorSystem(System):
    """``floor``, or with ``services`` ``floor-s3``."""

    def __init__(self, ctx: RunContext, services: BenchServices | None = None) -> None:
        self.ctx = ctx
        self.services = services
        self.name = "floor" if services is None else "floor-s3"
        self.results_prefix = "" if services is None else PREFIX
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

    def _record(
        self, future: Future[FloorRun], size: int, tasks: int, submitted: float, noticed: float
    ) -> WorkflowRecord:
        try:
            run = future.result()
        except Exception as exc:
            return WorkflowRecord(self.name, size, tasks, submitted, None, "FAILED", repr(exc))
        return WorkflowRecord(
            self.name,
            size,
            tasks,
            submitted,
            run.finished,
            "COMPLETED",
            ops_cpu_ms=run.ops_cpu_ms,
            noticed_at=noticed,
        )

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
        open_loop = point.arrival_rate > 0
        arrivals = Arrivals(
            1 if open_loop else point.concurrency,
            point.workflows if open_loop else point.rounds,
            point.arrival_rate,
            SEED,
        )
        in_flight: dict[Future[FloorRun], tuple[int, int, float]] = {}
        records: list[WorkflowRecord] = []

        def submit(user: int) -> None:
            size = arrivals.take(user).choice(point.sizes)
            if self.services is None:
                future = pool.submit(_job, inputs.paths[size], ops)
            else:
                future = pool.submit(_s3_job, inputs.uris[size], ops)
            in_flight[future] = (user, size, time.time())

        def wait_some(timeout: float | None) -> None:
            done, _ = wait(list(in_flight), timeout=timeout, return_when=FIRST_COMPLETED)
            noticed = time.time()
            for future in done:
                user, size, submitted = in_flight.pop(future)
                records.append(self._record(future, size, point.tasks, submitted, noticed))
                if arrivals.again(user):
                    submit(user)

        arrivals.drive(submit, lambda: bool(in_flight), wait_some)
        return records
