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
# -P: the working directory is not put on sys.path, so a folder named like one of our packages
# where `cdiflow up` was run cannot stand in for it.
API_COMMAND = ("{python}", "-P", "-m", "orchestrator.controller", "--host", "{host}",
               "--port", "{port}")  # fmt: skip
SCHEDULER_COMMAND = ("{python}", "-P", "-m", "orchestrator.scheduler", "--id", "{id}")
WORKER_COMMAND = ("{python}", "-P", "-m", "orchestrator.worker", "--id", "{id}")
