"""``Stack``: all of cdiflow on one machine, started in order, supervised, stopped in reverse.

``Stack`` is the façade; its collaborators: ``startup`` (what is refused before anything
starts, then each piece in order until it answers), ``process_table`` (the pieces by row name:
rows, PIDs, restarts, signals, and the stop in reverse order) and ``env`` (each process's
environment, and the admin key).
"""

from __future__ import annotations

import atexit
import logging
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Self

from cdi.hosts import HostNetwork
from cdi.link_emulator import SERVICES_ONLY, Link
from orchestrator.errors import StackError
from orchestrator.services import RunningServices
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
from orchestrator.stack.env import admin_key, host_environment
from orchestrator.stack.process_table import ProcessTable
from orchestrator.stack.restarts import RestartPolicy
from orchestrator.stack.startup import StartUp, check_can_start
from orchestrator.stack.state import DataDirLock, ProcessInfo
from orchestrator.stack.supervision import Supervised, Supervisor
from orchestrator.started import StartStop

__all__ = ["Stack"]

log = logging.getLogger(__name__)


class Stack(StartStop):
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
        # Several hosts: a minion with a gateway per host (cdi.cluster); the scheduler
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
        self._lock = DataDirLock(self.data_dir)
        self._table = ProcessTable(
            self.cdi,
            api_url=self.api_url,
            worker_ids=self.worker_ids,
            worker_metrics=self.worker_metrics,
            given_services=services,
        )
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
        if self._table.services is None:
            raise StackError("the stack is not running; call start() first")
        return self._table.services

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
            self._start_up().run()
        except BaseException:  # includes Ctrl-C: never leave a child behind
            self.stop()
            raise
        supervisor = Supervisor(
            self._table.supervised(),
            self._policy,
            on_change=self._restarted,
            alive_files=self._table.alive,
        )
        self._table.supervisor = supervisor
        supervisor.start()
        log.info("stack ready in %.1fs: API %s, data %s",
                 time.monotonic() - began, self.api_url, self.data_dir)  # fmt: skip
        return self

    def stop(self) -> None:
        """Stop workers, scheduler, API, minion, controller, then services; idempotent."""
        if not self._running:
            return
        self._table.stop_all(self.stop_timeout)
        self._running = False
        atexit.unregister(self.stop)
        self._lock.release()
        log.info("stack stopped (%s)", self.data_dir)

    def kill_worker(self, worker_id: str, sig: int = signal.SIGKILL) -> int:
        """Send ``sig`` to one worker by PID (the supervisor will restart it); return the PID."""
        return self._table.kill_worker(worker_id, sig)

    def pid_of(self, name: str) -> int | None:
        """PID of a process by its row name (``api``, ``worker-1``, ``cdi-minion``, ...)."""
        return self._table.pid_of(name)

    def restarts(self, name: str) -> int:
        """How many times the piece of that row name was restarted."""
        return self._table.restarts(name)

    def kill(self, name: str, sig: int = signal.SIGKILL) -> int:
        """Send ``sig`` to a piece by its row name (``postgres``, ``cdi-minion``, ``api``, a
        worker, ...); the supervisor restarts it. Returns the PID."""
        return self._table.kill(name, sig)

    def processes(self) -> list[ProcessInfo]:
        """Every piece in start order: services, controller, minion, API, scheduler, workers."""
        return self._table.rows()

    def environment(self, host: str = "host1", *, inside: bool = False) -> dict[str, str]:
        """The environment the stack's processes on ``host`` get (for launching another one
        alongside); ``inside``: for one run in the host's namespace (``CdiRuntime.host_of``),
        which reaches the services through the link emulator."""
        return host_environment(
            self.services,
            self.cdi,
            data_dir=self.data_dir,
            host=host,
            inside=inside,
            log_format=self.log_format,
            tasks=self.tasks,
        )

    # -- start-up -------------------------------------------------------------------------

    def _check_can_start(self) -> None:
        check_can_start(self.tasks, self.host, self.port, self.minion_socket)

    def _start_up(self) -> StartUp:
        return StartUp(
            self._table,
            self._commands,
            data_dir=self.data_dir,
            host=self.host,
            port=self.port,
            scheduler_id=self.scheduler_id,
            worker_host=self.worker_host,
            environment=self.environment,
            admin_env=self._admin_key,
            ready_timeout=self.ready_timeout,
            grace=self.grace,
        )

    def _admin_key(self) -> dict[str, str]:
        """Find or make the admin key; the variables that hand it to the API (and to it
        alone: ``stack_environment`` keeps it from the other processes)."""
        found = admin_key(self.data_dir)
        self.api_key, self.api_key_file = found.key, found.key_file
        return found.variables

    def _restarted(self, child: Supervised) -> None:
        if self._on_restart is not None:
            self._on_restart(child.name)


def _absolute_source(source: str) -> str:
    path = Path(source).expanduser()
    return str(path.absolute()) if path.exists() else source
