"""Celery 5 with the Redis broker: ``workers`` prefork processes, as cdiflow gets workers."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

from loadtest.drive import run_locust
from loadtest.plan import Point, Target, poll_max_s
from loadtest.stats import WorkflowRecord
from loadtest.systems.base import Inputs, RunContext, System
from loadtest.systems.services import BenchServices, clear_prefixes

__all__ = ["CelerySystem"]


class CelerySystem(System):
    name = "celery"

    def __init__(self, services: BenchServices, ctx: RunContext) -> None:
        self.services = services
        self.ctx = ctx
        self.broker = services.redis_url()
        self.backend = services.redis_url()
        self._proc: subprocess.Popen[bytes] | None = None

    def _env(self) -> dict[str, str]:
        running = self.services.running
        env = dict(
            os.environ,
            LOADTEST_CELERY_BROKER=self.broker,
            LOADTEST_CELERY_BACKEND=self.backend,
            S3_ENDPOINT_URL=self.services.s3_url,
            S3_BUCKET=running.s3_bucket,
            AWS_REGION=running.aws_region,
            PYTHONUNBUFFERED="1",
        )
        env["AWS_ACCESS_KEY_ID"] = running.aws_access_key_id or "testing"
        env["AWS_SECRET_ACCESS_KEY"] = running.aws_secret_access_key or "testing"
        return env

    def start(self) -> None:
        log = self.ctx.folder / "celery-worker.log"
        log.parent.mkdir(parents=True, exist_ok=True)
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
        with log.open("ab") as out:
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self._env(),
                start_new_session=True,
            )
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
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)  # warm shutdown: the pool children end with it
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # its own session: its group is its PID
            proc.wait()

    def run_point(self, point: Point, inputs: Inputs) -> list[WorkflowRecord]:
        folder = self.ctx.folder / "points" / self.name / point.label().replace(" ", "_")
        target = Target(
            system=self.name,
            images=[(inputs.uris[s], s) for s in point.sizes],
            tasks=point.tasks,
            concurrency=point.concurrency,
            rounds=point.rounds,
            records=str(folder / "records.jsonl"),
            celery_broker=self.broker,
            celery_backend=self.backend,
            poll_max_s=poll_max_s(point.concurrency),
        )
        return run_locust(
            target, folder, time_limit_s=self.ctx.time_limit_s, progress=self.ctx.progress
        )

    def after_point(self) -> None:
        clear_prefixes(self.services.running, ("celery/",))
