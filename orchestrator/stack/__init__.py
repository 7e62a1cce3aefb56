"""All of cdiflow on one machine: ``cdiflow up`` / ``down`` / ``status`` and ``Stack``.

    with Stack(".data", workers=2, port=8000) as stack:   # returns once every piece answers
        ...                                               # stack.api_url, stack.services, ...

Start order: Postgres/Redis/S3 (embedded unless configured), CDI controller, minion
(``<data>/cdi/minion.sock``), REST API, scheduler, workers; stop order is the reverse. Each
process logs to ``<data>/logs/<name>.log``. A scheduler or worker that exits on its own is
restarted with a back-off (``RestartPolicy``). ``cdiflow up`` runs the stack in a supervisor
process that writes ``<data>/stack.json`` for ``status`` and ``down``.

``Stack`` loads on first use (PEP 562): the CLI imports this package on every ``cdiflow`` run,
and ``Stack`` pulls in SQLAlchemy and gRPC.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from orchestrator.stack.defaults import (
    API_COMMAND,
    DEFAULT_HOST,
    DEFAULT_PORT,
    DEFAULT_WORKERS,
    SCHEDULER_COMMAND,
    WORKER_COMMAND,
)
from orchestrator.stack.restarts import RestartPolicy
from orchestrator.stack.state import ProcessInfo, StackState, read_state

if TYPE_CHECKING:
    from orchestrator.stack.stack import Stack

__all__ = [
    "API_COMMAND",
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "DEFAULT_WORKERS",
    "SCHEDULER_COMMAND",
    "WORKER_COMMAND",
    "ProcessInfo",
    "RestartPolicy",
    "Stack",
    "StackState",
    "read_state",
]


def __getattr__(name: str) -> Any:
    if name == "Stack":
        return importlib.import_module("orchestrator.stack.stack").Stack
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
