"""Defaults shared by ``Stack`` and the CLI, in a module light enough for ``cdiflow --help``."""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "API_COMMAND",
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "DEFAULT_WORKERS",
    "MINION_STATE",
    "SCHEDULER_COMMAND",
    "WORKER_COMMAND",
    "minion_state_folders",
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

# A minion's state folder (docs/minion-restart.md): <data>/cdi/minion-state, or with --hosts N
# each host's <data>/cdi/host<n>/minion-state (``cdi.cluster``).
MINION_STATE = "minion-state"


def minion_state_folders(data_dir: Path) -> list[Path]:
    """The state folders of the minions a stack of ``data_dir`` started, those that exist."""
    folder = data_dir / "cdi"
    found = [folder / MINION_STATE, *sorted(folder.glob(f"host*/{MINION_STATE}"))]
    return [path for path in found if path.is_dir()]
