"""The stack's running pieces by row name: their rows, PIDs, restarts and signals, and stopping
them all in reverse order.

A row name is a process's name in ``cdiflow status``: ``postgres``, ``redis``, ``s3``,
``cdi-controller``, ``cdi-minion`` (one per host with several), ``api``, the scheduler's id and
each worker's.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import ParamSpec

from cdi.child import ChildProcess
from orchestrator.errors import StackError
from orchestrator.services import RunningServices
from orchestrator.services.credentials import hide_password
from orchestrator.stack.cdi_runtime import CdiRuntime
from orchestrator.stack.state import ProcessInfo
from orchestrator.stack.supervised import ServiceProcess
from orchestrator.stack.supervision import Supervised, Supervisor
from orchestrator.stack.worker_process import WorkerProcess

__all__ = ["ProcessTable"]

log = logging.getLogger(__name__)

_P = ParamSpec("_P")


class ProcessTable:
    """What a stack has started: services, CDI processes, API, scheduler and workers, filled
    in as they start (so a failed start stops what it had started), and the supervisor."""

    def __init__(
        self,
        cdi: CdiRuntime,
        *,
        api_url: str,
        worker_ids: list[str],
        worker_metrics: dict[str, str],
        given_services: RunningServices | None,
    ) -> None:
        self.cdi = cdi
        self.api_url = api_url
        self.worker_ids = worker_ids
        self.worker_metrics = worker_metrics  # worker id -> its /metrics URL
        self.given_services = given_services  # running services, left running at the stop
        self.services: RunningServices | None = None
        self.api: ChildProcess | None = None
        self.scheduler: ChildProcess | None = None
        self.workers: dict[str, WorkerProcess] = {}
        self.supervisor: Supervisor | None = None
        self.alive: dict[str, Path] = {}  # name -> alive stamp, of the scheduler and workers

    def rows(self) -> list[ProcessInfo]:
        """Every piece in start order: services, controller, minion, API, scheduler, workers."""
        rows: list[ProcessInfo] = []
        if self.services is not None:
            svc = self.services
            embedded = {s.name: s for s in svc.embedded}
            urls = {"postgres": svc.database_url, "redis": svc.redis_url, "s3": svc.s3_endpoint_url}
            for name, url in urls.items():
                shown = hide_password(url)
                if (service := embedded.get(name)) is not None:
                    rows.append(self._row(name, service.pid, shown, service.log_file))
                else:
                    rows.append(ProcessInfo(name, None, shown))  # configured, not ours
        for cdi_child, address in self.cdi.processes:
            if cdi_child.pid is not None:
                rows.append(self._row(cdi_child.name, cdi_child.pid, address, cdi_child.log_path))
        if self.api is not None:
            rows.append(self._row("api", self.api.pid, self.api_url, self.api.log_path))
        for child in (self.scheduler, *self.workers.values()):
            if child is not None:
                address = self.worker_metrics.get(child.name, "")
                rows.append(self._row(child.name, child.pid, address, child.log_path))
        return rows

    def _row(self, name: str, pid: int | None, address: str, log_path: Path | None) -> ProcessInfo:
        row = ProcessInfo.of(name, pid, address, log_path)
        supervisor = self.supervisor
        if supervisor is None or name not in supervisor.names():
            return row
        return dataclasses.replace(
            row, restarts=supervisor.restarts(name), restarting=supervisor.restarting(name)
        )

    def supervised(self) -> list[Supervised]:
        """What the supervisor restarts: our services (not given ones), then every process."""
        pieces: list[Supervised] = []
        if self.given_services is None and self.services is not None:
            pieces += [ServiceProcess(service) for service in self.services.embedded]
        pieces += [p for p, _ in self.cdi.processes]
        pieces += [c for c in (self.api, self.scheduler, *self.workers.values()) if c]
        return pieces

    def pid_of(self, name: str) -> int | None:
        """PID of a process by its row name."""
        return next((p.pid for p in self.rows() if p.name == name), None)

    def restarts(self, name: str) -> int:
        """How many times the piece of that row name was restarted."""
        return self.supervisor.restarts(name) if self.supervisor is not None else 0

    def kill(self, name: str, sig: int) -> int:
        """Send ``sig`` to a piece by its row name; return the PID."""
        pid = self.pid_of(name)
        if pid is None:
            raise StackError(f"no running process {name!r} in this stack (a configured service?)")
        os.kill(pid, sig)
        return pid

    def kill_worker(self, worker_id: str, sig: int) -> int:
        """Send ``sig`` to one worker by PID; return the PID."""
        child = self.workers.get(worker_id)
        if child is None:
            raise StackError(f"no worker {worker_id!r}; workers: {', '.join(self.worker_ids)}")
        pid = child.pid
        if pid is None or not child.running:
            raise StackError(f"{worker_id} is not running now (it may be restarting)")
        child.send_signal(sig)
        return pid

    def stop_all(self, timeout: float) -> None:
        """Stop the supervisor, then workers, scheduler, API, minion, controller and our
        services; each step runs even when one before it failed."""
        if self.supervisor is not None:
            self.supervisor.stop()  # first, so nothing is restarted while we stop it
            self.supervisor = None
        workers = list(self.workers.values())
        for worker in workers:  # signal all, then wait: they stop in parallel
            _guard(worker.send_signal, signal.SIGTERM)
        for worker in workers:
            _guard(worker.finish, timeout)
        for child in (self.scheduler, self.api):
            if child is not None:
                _guard(child.stop, timeout)
        _guard(self.cdi.stop, timeout)
        if self.services is not None and self.given_services is None:
            _guard(self.services.stop)
        self.workers.clear()
        self.api = self.scheduler = None
        self.services = None


def _guard(step: Callable[_P, object], *args: _P.args, **kwargs: _P.kwargs) -> None:
    """Run one stop step; a failure is logged and the remaining steps still run."""
    try:
        step(*args, **kwargs)
    except Exception:
        log.exception("while stopping the stack")
