"""A worker of the stack, serving its Prometheus metrics on a port drawn for it, and drawn
again when another process took it."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Final

from cdi.child import ChildProcess
from orchestrator.child_process import free_port

__all__ = ["METRICS_HOST_ENV", "METRICS_PORT_ENV", "WorkerProcess"]

log = logging.getLogger(__name__)

METRICS_PORT_ENV: Final = "CDIFLOW_WORKER_METRICS_PORT"  # ``cdiflow worker --metrics-port``
METRICS_HOST_ENV: Final = "CDIFLOW_WORKER_METRICS_HOST"  # ``--metrics-host``


class WorkerProcess(ChildProcess):
    """A worker serving its metrics on a port drawn for it. A launch (the first, or the
    supervisor's relaunch) that follows one which ended on that port taken (another process
    bound it first, or took it while the worker was down) draws another port; ``serving`` is
    told each port drawn (the stack's metrics URL follows)."""

    def __init__(self, child: ChildProcess, serving: Callable[[int], None]) -> None:
        super().__init__(child.name, child.argv, log_path=child.log_path, env=child.env,
                         json_log=child.json_log)  # fmt: skip
        self._serving = serving
        self._draw()

    def _draw(self) -> None:
        port = free_port()
        assert self.env is not None  # the stack gives each child its environment
        self.env[METRICS_PORT_ENV] = str(port)
        self._serving(port)

    def port_taken(self) -> bool:
        """Whether its latest launch ended because its metrics port was in use (its log says
        so)."""
        return self.poll() is not None and "Address already in use" in self.log_tail()

    def start(self) -> WorkerProcess:
        if self.port_taken():
            log.warning("%s: its metrics port was taken; launching it on another", self.name)
            self._draw()
        super().start()
        return self
