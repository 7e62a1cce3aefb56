"""``Stack``: all of cdiflow on one machine, started in order, supervised, stopped in reverse."""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import ParamSpec, Self

import redis

from cdi.hosts import HostNetwork
from cdi.link_emulator import SERVICES_ONLY, Link
from orchestrator.apikeys import ensure_key_file
from orchestrator.child_process import ChildProcess, describe_exit, free_port, port_is_free
from orchestrator.contract.alive import ALIVE_FILE_ENV
from orchestrator.contract.keys import worker_key
from orchestrator.errors import StackError
from orchestrator.logs import LOG_FORMAT_ENV
from orchestrator.services import RunningServices, start_services
from orchestrator.settings import load_settings
from orchestrator.stack import probes
from orchestrator.stack.cdi_runtime import CdiRuntime
from orchestrator.stack.defaults import (
    API_COMMAND,
    DEFAULT_HOST,
    DEFAULT_PORT,
    DEFAULT_WORKERS,
    SCHEDULER_COMMAND,
    WORKER_COMMAND,
)
from orchestrator.stack.env import stack_environment
from orchestrator.stack.restarts import RestartPolicy
from orchestrator.stack.state import DataDirLock, ProcessInfo
from orchestrator.stack.supervised import ServiceProcess
from orchestrator.stack.supervision import Supervised, Supervisor
from workflows.loader import with_sources

__all__ = ["Stack"]

log = logging.getLogger(__name__)

_SOCKET_PATH_MAX = 107  # sun_path holds 108 bytes with the terminating NUL

_P = ParamSpec("_P")


class Stack:
    """Services, CDI controller and minion, API, scheduler and workers, as child processes.

        with Stack("/tmp/data", workers=2, port=8001) as stack:
            httpx.post(f"{stack.api_url}/api/workflows", headers=stack.auth_headers, ...)

    ``start()`` returns once every piece answers; any piece that exits on its own (an embedded
    service, the CDI controller or minion, the API, the scheduler, a worker) is restarted with
    a back-off (see ``RestartPolicy``). ``stop()`` ends everything in reverse order, by PID.
    One stack per data folder (``StackRunning`` otherwise). Pass ``services`` to use running
    services instead of starting them (they are then left running).

    The CDI controller and minion share the caller's process group, so a terminal Ctrl-C
    reaches them directly; ``cdiflow up`` therefore runs its stack in a session of its own.
    """

    def __init__(
        self,
        data_dir: Path | str | None = None,
        *,
        workers: int = DEFAULT_WORKERS,
        hosts: int = 1,
        host: str = DEFAULT_HOST,
        port: int = DEFAULT_PORT,
        api_command: Sequence[str] = API_COMMAND,
        scheduler_command: Sequence[str] = SCHEDULER_COMMAND,
        worker_command: Sequence[str] = WORKER_COMMAND,
        services: RunningServices | None = None,
        restart_policy: RestartPolicy | None = None,
        ready_timeout: float = 60.0,
        grace: float = 1.0,
        stop_timeout: float = 10.0,
        on_restart: Callable[[str], None] | None = None,
        tasks: Sequence[str] = (),
        log_format: str = "text",
        network: HostNetwork | None = None,
        link: Link | None = SERVICES_ONLY,
    ) -> None:
        if workers < 0:
            raise StackError(f"workers must be 0 or more, not {workers}")
        if not 1 <= hosts <= 16:
            raise StackError(f"hosts must be between 1 and 16, not {hosts}")
        # Task code beside the settings' (``--tasks``), which the API and the workers get as
        # CDIFLOW_TASK_PATHS and CDIFLOW_TASK_PACKAGES; a path is made absolute here, where the
        # caller's working directory is known.
        self.tasks = [_absolute_source(source) for source in tasks]
        self.log_format = log_format  # the API's, the scheduler's and the workers' logs
        self.worker_metrics: dict[str, str] = {}  # worker id -> its /metrics URL
        folder = load_settings().data_dir if data_dir is None else Path(data_dir)
        self.data_dir = folder.expanduser().absolute()
        self.host = host
        self.port = port
        self.api_url = f"http://{probes.url_host(host)}:{port}"
        # Several hosts: a minion with a gateway per host (cdi.remote.cluster); the scheduler
        # and the API use host 1's, worker n host ((n - 1) mod hosts) + 1's.
        self.hosts = hosts
        # Several hosts: each worker on its host (in its namespace), reaching the services
        # through the link (``CdiRuntime``), unless ``link`` is None or no link can be had.
        self.cdi = CdiRuntime(self.data_dir, self.data_dir / "logs", hosts, network, link)
        self.minion_socket = self.cdi.socket_of("host1")
        # The admin key: the configured one (CDIFLOW_ADMIN_KEY[_FILE]), else <data>/api-key,
        # made at the first start.
        self.api_key = ""
        self.api_key_file: Path | None = None
        self.scheduler_id = "scheduler-1"
        self.worker_ids = [f"worker-{n}" for n in range(1, workers + 1)]
        self.worker_host = {w: f"host{i % hosts + 1}" for i, w in enumerate(self.worker_ids)}
        self.ready_timeout = ready_timeout
        self.grace = grace
        self.stop_timeout = stop_timeout
        self._commands = {
            "api": list(api_command),
            "scheduler": list(scheduler_command),
            "worker": list(worker_command),
        }
        self._policy = restart_policy or RestartPolicy()
        self._on_restart = on_restart
        self._given_services = services
        self._services: RunningServices | None = None
        self._lock = DataDirLock(self.data_dir)
        self._api: ChildProcess | None = None
        self._scheduler: ChildProcess | None = None
        self._workers: dict[str, ChildProcess] = {}
        self._supervisor: Supervisor | None = None
        self._alive: dict[str, Path] = {}  # name -> alive stamp, of the scheduler and workers
        self._running = False

    # -- public ---------------------------------------------------------------------------

    @property
    def auth_headers(self) -> dict[str, str]:
        """The header that makes a request to this stack's API its admin's (after start)."""
        if not self.api_key:
            raise StackError("the stack is not running; call start() first")
        return {"Authorization": f"Bearer {self.api_key}"}

    @property
    def controller_url(self) -> str:
        return self.cdi.controller_url

    @property
    def logs_dir(self) -> Path:
        return self.data_dir / "logs"

    @property
    def services(self) -> RunningServices:
        if self._services is None:
            raise StackError("the stack is not running; call start() first")
        return self._services

    def preflight(self) -> None:
        """Raise now what ``start()`` would refuse (``StackRunning``, a taken port, a socket
        path too long), without starting anything."""
        if self._running:
            return
        self._lock.acquire()
        try:
            self._check_can_start()
        finally:
            self._lock.release()

    def start(self) -> Self:
        """Start every piece in order and wait until each answers; idempotent.

        Raises ``StackRunning``, ``StackError`` (naming the log to read) or ``ServiceError``,
        after stopping whatever it had started.
        """
        if self._running:
            return self
        self._lock.acquire()  # first: a second stack is told so, not that the port is taken
        try:
            self._check_can_start()
        except BaseException:
            self._lock.release()
            raise
        self._running = True
        atexit.register(self.stop)  # a caller that forgets stop() must not leak the children
        began = time.monotonic()
        try:
            self._start_all()
        except BaseException:  # includes Ctrl-C: never leave a child behind
            self.stop()
            raise
        self._supervisor = Supervisor(
            self._supervised(), self._policy, on_change=self._restarted, alive_files=self._alive
        )
        self._supervisor.start()
        log.info("stack ready in %.1fs: API %s, data %s",
                 time.monotonic() - began, self.api_url, self.data_dir)  # fmt: skip
        return self

    def stop(self) -> None:
        """Stop workers, scheduler, API, minion, controller, then services; idempotent."""
        if not self._running:
            return
        if self._supervisor is not None:
            self._supervisor.stop()  # first, so nothing is restarted while we stop it
            self._supervisor = None
        workers = list(self._workers.values())
        for worker in workers:  # signal all, then wait: they stop in parallel
            _guard(worker.send_signal, signal.SIGTERM)
        for worker in workers:
            _guard(worker.finish, self.stop_timeout)
        for child in (self._scheduler, self._api):
            if child is not None:
                _guard(child.stop, self.stop_timeout)
        _guard(self.cdi.stop, self.stop_timeout)
        if self._services is not None and self._given_services is None:
            _guard(self._services.stop)
        self._workers.clear()
        self._api = self._scheduler = None
        self._services = None
        self._running = False
        atexit.unregister(self.stop)
        self._lock.release()
        log.info("stack stopped (%s)", self.data_dir)

    def kill_worker(self, worker_id: str, sig: int = signal.SIGKILL) -> int:
        """Send ``sig`` to one worker by PID (the supervisor will restart it); return the PID."""
        child = self._workers.get(worker_id)
        if child is None:
            raise StackError(f"no worker {worker_id!r}; workers: {', '.join(self.worker_ids)}")
        pid = child.pid
        if pid is None or not child.running:
            raise StackError(f"{worker_id} is not running now (it may be restarting)")
        child.send_signal(sig)
        return pid

    def pid_of(self, name: str) -> int | None:
        """PID of a process by its row name (``api``, ``worker-1``, ``cdi-minion``, ...)."""
        return next((p.pid for p in self.processes() if p.name == name), None)

    def restarts(self, name: str) -> int:
        """How many times the piece of that row name was restarted."""
        return self._supervisor.restarts(name) if self._supervisor is not None else 0

    def kill(self, name: str, sig: int = signal.SIGKILL) -> int:
        """Send ``sig`` to a piece by its row name (``postgres``, ``cdi-minion``, ``api``, a
        worker, ...); the supervisor restarts it. Returns the PID."""
        pid = self.pid_of(name)
        if pid is None:
            raise StackError(f"no running process {name!r} in this stack (a configured service?)")
        os.kill(pid, sig)
        return pid

    def processes(self) -> list[ProcessInfo]:
        """Every piece in start order: services, controller, minion, API, scheduler, workers."""
        rows: list[ProcessInfo] = []
        if self._services is not None:
            svc = self._services
            embedded = {s.name: s for s in svc.embedded}
            urls = {"postgres": svc.database_url, "redis": svc.redis_url, "s3": svc.s3_endpoint_url}
            for name, url in urls.items():
                shown = probes.hide_password(url)
                if (service := embedded.get(name)) is not None:
                    rows.append(self._row(name, service.pid, shown, service.log_file))
                else:
                    rows.append(ProcessInfo(name, None, shown))  # configured, not ours
        for cdi_child, address in self.cdi.processes:
            if cdi_child.pid is not None:
                rows.append(self._row(cdi_child.name, cdi_child.pid, address, cdi_child.log_path))
        if self._api is not None:
            rows.append(self._row("api", self._api.pid, self.api_url, self._api.log_path))
        for child in (self._scheduler, *self._workers.values()):
            if child is not None:
                address = self.worker_metrics.get(child.name, "")
                rows.append(self._row(child.name, child.pid, address, child.log_path))
        return rows

    def _row(self, name: str, pid: int | None, address: str, log_path: Path | None) -> ProcessInfo:
        row = ProcessInfo.of(name, pid, address, log_path)
        supervisor = self._supervisor
        if supervisor is None or name not in supervisor.names():
            return row
        return dataclasses.replace(
            row, restarts=supervisor.restarts(name), restarting=supervisor.restarting(name)
        )

    def _supervised(self) -> list[Supervised]:
        """What the supervisor restarts: our services (not given ones), then every process."""
        pieces: list[Supervised] = []
        if self._given_services is None and self._services is not None:
            pieces += [ServiceProcess(service) for service in self._services.embedded]
        pieces += [p for p, _ in self.cdi.processes]
        pieces += [c for c in (self._api, self._scheduler, *self._workers.values()) if c]
        return pieces

    def environment(self, host: str = "host1", *, inside: bool = False) -> dict[str, str]:
        """The environment the stack's processes on ``host`` get (for launching another one
        alongside); ``inside``: for one run in the host's namespace (``CdiRuntime.host_of``),
        which reaches the services through the link emulator."""
        env = stack_environment(
            self.services,
            data_dir=self.data_dir,
            minion_socket=self.cdi.socket_of(host),
            controller_url=self.controller_url,
        )
        if inside and self.cdi.host_of(host) is not None:
            for name in ("DATABASE_URL", "REDIS_URL", "S3_ENDPOINT_URL"):
                env[name] = self.cdi.reachable(env[name])
        env[LOG_FORMAT_ENV] = self.log_format
        if self.tasks:  # the API and the workers read where tasks may come from alike
            sources = with_sources(load_settings().task_sources(), self.tasks)
            env["CDIFLOW_TASK_PACKAGES"] = ",".join(sources.packages)
            env["CDIFLOW_TASK_PATHS"] = os.pathsep.join(str(p) for p in sources.paths)
        return env

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- start-up -------------------------------------------------------------------------

    def _check_can_start(self) -> None:
        """Refuse early, before starting anything, what would fail later."""
        try:
            with_sources(load_settings().task_sources(), self.tasks)
        except ValueError as exc:
            raise StackError(f"--tasks: {exc}") from exc
        if not port_is_free(self.host, self.port):
            raise StackError(
                f"port {self.port} on {self.host} is already in use, so the API cannot listen "
                "there; stop what listens on it or choose another port with --port"
            )
        if len(os.fsencode(self.minion_socket)) > _SOCKET_PATH_MAX:
            raise StackError(
                f"the minion socket path {self.minion_socket} is longer than a Unix socket "
                f"allows ({_SOCKET_PATH_MAX} bytes); choose a shorter --data-dir"
            )

    def _start_all(self) -> None:
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        self._services = self._given_services or start_services(self.data_dir)
        self.cdi.start()
        env = self.environment()

        self._api = self._child("api", "api", env | self._admin_key())
        self._api.start()
        healthz = f"{self.api_url}/api/healthz"
        self._wait(self._api, lambda: probes.http_ok(healthz), lambda: f"GET {healthz} = 200")

        self._scheduler = self._child(self.scheduler_id, "scheduler", env)
        self._scheduler.start()
        scheduler = self._scheduler
        self._wait(scheduler, lambda: time.monotonic() - scheduler.started_at >= self.grace,
                   lambda: f"it to stay up for {self.grace:g}s")  # fmt: skip

        self._workers = {}
        for wid in self.worker_ids:  # each serves its Prometheus metrics on a port of its own
            port = free_port()
            host = self.cdi.host_of(self.worker_host[wid])
            address = host.address if host is not None else "127.0.0.1"
            self.worker_metrics[wid] = f"http://{address}:{port}/metrics"
            own_env = self.environment(self.worker_host[wid], inside=host is not None)
            own_env["CDIFLOW_WORKER_METRICS_PORT"] = str(port)
            self._workers[wid] = self._child(
                wid, "worker", own_env, wrap=host.wrap if host is not None else None
            )
        for worker in self._workers.values():
            worker.start()
        client = redis.Redis.from_url(
            self.services.redis_url,
            decode_responses=True,
            socket_timeout=2,
            socket_connect_timeout=2,
        )
        try:
            for worker in self._workers.values():
                self._wait_heartbeat(client, worker)
        finally:
            client.close()

    def _admin_key(self) -> dict[str, str]:
        """Find or make the admin key; the variables that hand it to the API (and to it
        alone: ``stack_environment`` keeps it from the other processes)."""
        configured = load_settings()
        if (key := configured.resolved_admin_key()) is not None:
            self.api_key, self.api_key_file = key, configured.admin_key_file
            if configured.admin_key_file is not None:
                return {"CDIFLOW_ADMIN_KEY_FILE": str(configured.admin_key_file)}
            return {"CDIFLOW_ADMIN_KEY": key}
        self.api_key_file, self.api_key = ensure_key_file(self.data_dir)
        return {"CDIFLOW_ADMIN_KEY_FILE": str(self.api_key_file)}

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
        for arg in self._commands[kind]:
            for placeholder, value in values.items():
                arg = arg.replace(placeholder, value)
            argv.append(arg)
        if wrap is not None:
            argv = wrap(argv)
        if kind in ("scheduler", "worker"):  # the processes that keep an alive stamp
            self._alive[name] = self.data_dir / "alive" / name
            self._alive[name].parent.mkdir(exist_ok=True)
            env = env | {ALIVE_FILE_ENV: str(self._alive[name])}
        return ChildProcess(name, argv, env=env, log_path=self.logs_dir / f"{name}.log")

    def _wait(
        self, child: ChildProcess, ready: Callable[[], bool], what: Callable[[], str]
    ) -> None:
        """Poll ``ready`` until true; raise with the log's tail if the child ends or stalls."""
        deadline = time.monotonic() + self.ready_timeout
        while True:
            status = child.poll()
            if status is not None:
                raise self._failed(child, f"{child.name} exited with {describe_exit(status)} "
                                          "while starting")  # fmt: skip
            if ready():
                log.info("%s ready (pid %s, log %s)", child.name, child.pid, child.log_path)
                return
            if time.monotonic() > deadline:
                raise self._failed(
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

    def _failed(self, child: ChildProcess, message: str) -> StackError:
        log_file = child.log_path
        assert log_file is not None  # the stack's children all write a log of their own
        text = f"{message}; see {log_file}"
        if tail := child.log_tail():
            text += f"\n--- last lines of {log_file.name} ---\n{tail}"
        return StackError(text, log_file=log_file)

    def _restarted(self, child: Supervised) -> None:
        if self._on_restart is not None:
            self._on_restart(child.name)


def _absolute_source(source: str) -> str:
    path = Path(source).expanduser()
    return str(path.absolute()) if path.exists() else source


def _guard(step: Callable[_P, object], *args: _P.args, **kwargs: _P.kwargs) -> None:
    """Run one stop step; a failure is logged and the remaining steps still run."""
    try:
        step(*args, **kwargs)
    except Exception:
        log.exception("while stopping the stack")
