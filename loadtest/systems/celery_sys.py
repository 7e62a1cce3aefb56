"""Celery 5 with the Redis broker: ``workers`` prefork processes, as cdiflow gets workers.

The worker runs on the peer's own state (``peer_state.PeerState``): no ``CELERY_*`` setting
or file of the user's reaches it.
"""

from __future__ import annotations

import os
import sys
import time

from cdi.child import ChildProcess
from loadtest.drive import run_locust
from loadtest.plan import Point, poll_max_s
from loadtest.stats import WorkflowRecord
from loadtest.systems.base import Inputs, RunContext, System
from loadtest.systems.peer_state import PeerState
from loadtest.systems.services import BenchServices, clear_prefixes, peer_env

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
        self._proc: ChildProcess | None = None
        self._state: PeerState | None = None

    def _env(self, state: PeerState) -> dict[str, str]:
        return dict(
            state.env(peer_env(self.services)),
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
        log = self.ctx.folder / "celery-worker.log"
        self._state = state = PeerState("celery")
        try:
            env = self._env(state)
            self._proc = ChildProcess("celery worker", argv, log_path=log, env=env).start()
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
        if proc is not None:  # SIGTERM is Celery's warm shutdown: the pool children end with it
            proc.stop(20.0, sweep_group=True)
        state, self._state = self._state, None
        if state is not None:
            state.remove()

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
