"""Celery 5 with the Redis broker: ``workers`` prefork processes, as cdiflow gets workers."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from loadtest.drive import run_locust
from loadtest.plan import Point, poll_max_s
from loadtest.stats import WorkflowRecord
from loadtest.systems.base import Inputs, RunContext, System
from loadtest.systems.procs import peer_env, spawn, stop_process
from loadtest.systems.services import BenchServices, clear_prefixes

__all__ = ["CelerySystem"]


class CelerySystem(System):
    name = "celery"
    results_prefix = "celery/results/"
    intermediates_via_s3 = True

    def __init__(self, services: BenchServices, ctx: RunContext) -> None:
        self.services = services
        self.ctx = ctx
        self.broker = services.redis_url()
        self.backend = services.redis_url()
        self._proc: subprocess.Popen[bytes] | None = None

    def _env(self) -> dict[str, str]:
        return dict(
            peer_env(self.services),
            LOADTEST_CELERY_BROKER=self.broker,
            LOADTEST_CELERY_BACKEND=self.backend,
        )

    def start(self) -> None:
        argv = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "loadtest.systems.celery_app",
            "worker",
            "--concurrency",
            str(self.ctx.workers),
            "--pool",
            "prefork",
            "--loglevel",
            "WARNING",
            "--hostname",
            f"bench-{os.getpid()}@%h",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ]
        self._proc = spawn(argv, self.ctx.folder / "celery-worker.log", self._env())
        try:
            self._wait_ready(timeout=60)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, timeout: float) -> None:
        """A round trip through the broker, a worker and the result backend."""
        from loadtest.systems.celery_app import make_app

        app = make_app(self.broker, self.backend)
        deadline = time.monotonic() + timeout
        result = app.send_task("loadtest.ping")
        try:
            while not result.ready():
                if self._proc is not None and self._proc.poll() is not None:
                    raise RuntimeError(f"the Celery worker exited; see {self.ctx.folder}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the Celery worker did not answer in {timeout:g} s")
                time.sleep(0.1)
        finally:
            app.close()

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        stop_process(proc)  # SIGTERM is Celery's warm shutdown: the pool children end with it

    def run_point(self, point: Point, inputs: Inputs) -> list[WorkflowRecord]:
        target, folder = self.point_target(
            point,
            inputs,
            celery_broker=self.broker,
            celery_backend=self.backend,
            poll_max_s=poll_max_s(point.concurrency),
        )
        return run_locust(
            target, folder, time_limit_s=self.ctx.time_limit_s, progress=self.ctx.progress
        )

    def after_point(self) -> None:
        clear_prefixes(self.services.running, ("celery/",))
