"""A stack's start-up: what is refused before anything starts, then each piece in order, each
waited for until it answers.

Services (unless given), the CDI controller and minion(s), the API (until ``/api/healthz``
answers), the scheduler (until it has stayed up for the grace period), then the workers, each
until its heartbeat is in Redis. A piece that exits or stalls while starting raises
``StackError`` with the tail of its log.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Final, Protocol

import redis

from cdi.auth import CONTROLLER_TOKEN_ENV
from cdi.child import ChildProcess, describe_exit
from orchestrator.child_process import port_is_free
from orchestrator.contract.alive import ALIVE_FILE_ENV
from orchestrator.contract.keys import worker_key
from orchestrator.errors import StackError
from orchestrator.logs import LOG_FORMAT_ENV
from orchestrator.private import private_dir
from orchestrator.services import start_services
from orchestrator.settings import load_settings
from orchestrator.stack import probes
from orchestrator.stack.process_table import ProcessTable
from orchestrator.stack.worker_process import METRICS_HOST_ENV, WorkerProcess
from workflows.loader import with_sources

__all__ = ["Environment", "StartUp", "check_can_start"]

log = logging.getLogger(__name__)
# Starts of a worker whose metrics port another process took between its draw and its bind.
PORT_ATTEMPTS: Final = 3

SOCKET_PATH_MAX: Final = 107  # sun_path holds 108 bytes with the terminating NUL


class Environment(Protocol):
    """The environment of the stack's processes on ``host`` (``Stack.environment``)."""

    def __call__(self, host: str = ..., *, inside: bool = ...) -> dict[str, str]: ...


def check_can_start(tasks: Sequence[str], host: str, port: int, minion_socket: str) -> None:
    """Refuse early, before starting anything, what would fail later."""
    try:
        with_sources(load_settings().task_sources(), tasks)
    except ValueError as exc:
        raise StackError(f"--tasks: {exc}") from exc
    if not port_is_free(host, port):
        raise StackError(
            f"port {port} on {host} is already in use, so the API cannot listen "
            "there; stop what listens on it or choose another port with --port"
        )
    if len(os.fsencode(minion_socket)) > SOCKET_PATH_MAX:
        raise StackError(
            f"the minion socket path {minion_socket} is longer than a Unix socket "
            f"allows ({SOCKET_PATH_MAX} bytes); choose a shorter --data-dir"
        )


class StartUp:
    """Starts a stack's pieces into ``table``, in order, as each before it answers."""

    def __init__(
        self,
        table: ProcessTable,
        commands: Mapping[str, Sequence[str]],
        *,
        data_dir: Path,
        host: str,
        port: int,
        scheduler_id: str,
        worker_host: Mapping[str, str],
        environment: Environment,
        admin_env: Callable[[], dict[str, str]],
        ready_timeout: float,
        grace: float,
    ) -> None:
        self.table = table
        self.commands = commands  # command templates by kind: api, scheduler, worker
        self.data_dir = data_dir
        self.logs_dir = data_dir / "logs"
        self.host = host
        self.port = port
        self.scheduler_id = scheduler_id
        self.worker_host = worker_host  # worker id -> its host's name
        self.environment = environment
        self.admin_env = admin_env  # the variables that hand the admin key to the API
        self.ready_timeout = ready_timeout
        self.grace = grace

    def run(self) -> None:
        table = self.table
        private_dir(self.logs_dir)
        table.services = table.given_services or start_services(self.data_dir)
        table.cdi.start()
        env = self.environment()

        # The API alone gets the admin key; it and the scheduler (which runs no task code, and
        # looks for objects its runs left on every host) the token that reads the directory.
        reader = {f"{CONTROLLER_TOKEN_ENV}_FILE": str(table.cdi.reader_token_file)}
        table.api = api = self._child("api", "api", env | self.admin_env() | reader)
        api.start()
        healthz = f"{table.api_url}/api/healthz"
        self._wait(api, lambda: probes.http_ok(healthz), lambda: f"GET {healthz} = 200")

        table.scheduler = scheduler = self._child(self.scheduler_id, "scheduler", env | reader)
        scheduler.start()
        self._wait(scheduler, lambda: time.monotonic() - scheduler.started_at >= self.grace,
                   lambda: f"it to stay up for {self.grace:g}s")  # fmt: skip

        table.workers = {wid: self._worker(wid) for wid in table.worker_ids}
        for worker in table.workers.values():
            worker.start()
        client = redis.Redis.from_url(
            table.services.redis_url,
            decode_responses=True,
            socket_timeout=2,
            socket_connect_timeout=2,
        )
        try:
            for wid in table.worker_ids:
                for attempt in range(1, PORT_ATTEMPTS + 1):
                    worker = table.workers[wid]
                    try:
                        self._wait_heartbeat(client, worker)
                        break
                    except StackError:
                        if attempt == PORT_ATTEMPTS or not worker.port_taken():
                            raise
                    # Its metrics port was free when drawn, but another process took it first:
                    # the relaunch draws another (and says so).
                    worker.start()
        finally:
            client.close()

    def _worker(self, wid: str) -> WorkerProcess:
        """Worker ``wid``, to serve its Prometheus metrics on a port of its own."""
        table = self.table
        host = table.cdi.host_of(self.worker_host[wid])
        address = host.address if host is not None else "127.0.0.1"
        own_env = self.environment(self.worker_host[wid], inside=host is not None)
        own_env[METRICS_HOST_ENV] = address  # its host's, else loopback

        def serving(port: int) -> None:
            table.worker_metrics[wid] = f"http://{address}:{port}/metrics"

        child = self._child(wid, "worker", own_env, wrap=host.wrap if host is not None else None)
        return WorkerProcess(child, serving)

    def _child(
        self,
        name: str,
        kind: str,
        env: dict[str, str],
        wrap: Callable[[Sequence[str]], list[str]] | None = None,
    ) -> ChildProcess:
        """``wrap``: run the command through it (``Host.wrap``: in a host's namespace)."""
        values = {"{python}": sys.executable, "{id}": name,
                  "{host}": self.host, "{port}": str(self.port)}  # fmt: skip
        argv = []
        for arg in self.commands[kind]:
            for placeholder, value in values.items():
                arg = arg.replace(placeholder, value)
            argv.append(arg)
        if wrap is not None:
            argv = wrap(argv)
        if kind in ("scheduler", "worker"):  # the processes that keep an alive stamp
            alive = self.table.alive
            alive[name] = self.data_dir / "alive" / name
            private_dir(alive[name].parent)
            env = env | {ALIVE_FILE_ENV: str(alive[name])}
        json_log = env.get(LOG_FORMAT_ENV) == "json"  # the child's lines are JSON: so is ours
        log_path = self.logs_dir / f"{name}.log"
        return ChildProcess(name, argv, env=env, log_path=log_path, json_log=json_log)

    def _wait(
        self, child: ChildProcess, ready: Callable[[], bool], what: Callable[[], str]
    ) -> None:
        """Poll ``ready`` until true; raise with the log's tail if the child ends or stalls."""
        deadline = time.monotonic() + self.ready_timeout
        while True:
            status = child.poll()
            if status is not None:
                raise _failed(child, f"{child.name} exited with {describe_exit(status)} "
                                     "while starting")  # fmt: skip
            if ready():
                log.info("%s ready (pid %s, log %s)", child.name, child.pid, child.log_path)
                return
            if time.monotonic() > deadline:
                raise _failed(
                    child, f"{child.name} was not ready within {self.ready_timeout:g}s "
                    f"(waited for {what()})"
                )  # fmt: skip
            time.sleep(0.05)

    def _wait_heartbeat(self, client: redis.Redis, worker: ChildProcess) -> None:
        problem = ""

        def beating() -> bool:
            nonlocal problem
            try:
                return probes.worker_heartbeat(client, worker.name, worker.launched_at)
            except redis.RedisError as exc:  # Redis may be busy; the deadline still holds
                problem = f"; last Redis error: {exc}"
                return False

        key = worker_key(worker.name)
        self._wait(worker, beating, lambda: f"its heartbeat {key} in Redis{problem}")


def _failed(child: ChildProcess, message: str) -> StackError:
    log_file = child.log_path
    assert log_file is not None  # the stack's children all write a log of their own
    text = f"{message}; see {log_file}"
    if tail := child.log_tail():
        text += f"\n--- last lines of {log_file.name} ---\n{tail}"
    return StackError(text, log_file=log_file)
