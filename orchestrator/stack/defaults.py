"""Defaults shared by ``Stack`` and the CLI, in a module light enough for ``cdiflow --help``."""

from __future__ import annotations

__all__ = [
    "API_COMMAND",
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "DEFAULT_WORKERS",
    "SCHEDULER_COMMAND",
    "WORKER_COMMAND",
]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
DEFAULT_WORKERS = 2

# Command templates; "{python}", "{id}", "{host}" and "{port}" are replaced in each argument.
API_COMMAND = ("{python}", "-m", "orchestrator.controller", "--host", "{host}", "--port", "{port}")
SCHEDULER_COMMAND = ("{python}", "-m", "orchestrator.scheduler", "--id", "{id}")
WORKER_COMMAND = ("{python}", "-m", "orchestrator.worker", "--id", "{id}")
