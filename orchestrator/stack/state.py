"""What a running stack leaves in its data folder: ``stack.lock`` and ``stack.json``.

The lock (an ``flock`` held by whoever runs the stack) makes "one stack per data folder" hold
even against a stale ``stack.json``; the JSON file tells ``cdiflow status`` and ``cdiflow down``
which processes belong to the stack. Each PID is stored with its start time, so a PID the
kernel has since given to an unrelated process is never mistaken for ours (nor signalled).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Self

import psutil

from orchestrator.errors import StackError, StackRunning
from orchestrator.private import open_private, private_dir, write_private

__all__ = [
    "DataDirLock",
    "ProcessInfo",
    "StackState",
    "format_table",
    "read_state",
    "remove_state",
    "state_path",
    "write_state",
]

STATE_FILE = "stack.json"
LOCK_FILE = "stack.lock"


@dataclass(frozen=True)
class ProcessInfo:
    """One row of the stack: a process we started, or a configured service (no PID)."""

    name: str
    pid: int | None
    address: str = ""
    log: str = ""
    create_time: float | None = None  # psutil's start time, to recognise the PID later
    restarts: int = 0  # by the stack's supervisor, since the stack started
    restarting: bool = False  # it exited and the supervisor is bringing it back

    @classmethod
    def of(cls, name: str, pid: int | None, address: str = "", log: Path | None = None) -> Self:
        """A row for a live ``pid``, recording its start time now."""
        created = None
        if pid is not None:
            with contextlib.suppress(psutil.Error):
                created = psutil.Process(pid).create_time()
        return cls(name, pid, address, str(log) if log else "", created)

    def alive(self) -> bool:
        """Whether our process still runs (not a zombie, not a reused PID)."""
        if self.pid is None:
            return False
        try:
            proc = psutil.Process(self.pid)
            if self.create_time is not None and abs(proc.create_time() - self.create_time) > 0.05:
                return False
            return proc.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False


@dataclass(frozen=True)
class StackState:
    """The content of ``stack.json``."""

    supervisor: ProcessInfo
    started_at: str  # ISO 8601, UTC
    data_dir: str
    api_url: str
    controller_url: str
    minion_socket: str
    processes: tuple[ProcessInfo, ...] = field(default_factory=tuple)  # in start order
    api_key_file: str = ""  # where the admin key is (never the key itself); "": configured

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Self:
        raw: dict[str, Any] = json.loads(text)
        return cls(
            supervisor=ProcessInfo(**raw["supervisor"]),
            started_at=raw["started_at"],
            data_dir=raw["data_dir"],
            api_url=raw["api_url"],
            controller_url=raw["controller_url"],
            minion_socket=raw["minion_socket"],
            processes=tuple(ProcessInfo(**p) for p in raw["processes"]),
            api_key_file=raw.get("api_key_file", ""),
        )


def state_path(data_dir: Path) -> Path:
    return data_dir / STATE_FILE


def write_state(data_dir: Path, state: StackState) -> None:
    """Replace ``stack.json`` atomically: a reader sees the old file or the new, never half."""
    write_private(state_path(data_dir), state.to_json())


def read_state(data_dir: Path) -> StackState | None:
    """``stack.json`` of ``data_dir``, or ``None`` when there is none."""
    path = state_path(data_dir)
    try:
        return StackState.from_json(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise StackError(f"{path} is unreadable ({exc}); remove it if no stack runs") from exc


def remove_state(data_dir: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        state_path(data_dir).unlink()


class DataDirLock:
    """One stack per data folder: an exclusive ``flock`` on ``<data>/stack.lock``.

    The kernel drops the lock when its holder dies, so a crash never leaves it stuck. The
    holder's PID is written into the file for the message a second comer gets. ``name`` and
    ``busy`` serve other one-per-folder runs (``cdiflow bench workflows``): the lock file's
    name, and the message from the folder and the holder's PID (``None``: unknown).
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        name: str = LOCK_FILE,
        busy: Callable[[Path, int | None], str] | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.path = data_dir / name
        self._busy = busy
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise ``StackRunning`` naming the running stack."""
        private_dir(self.data_dir)
        fd = open_private(self.path, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder_pid(fd)
            os.close(fd)
            message = (
                self._busy(self.data_dir, holder)
                if self._busy is not None
                else running_message(self.data_dir)
            )
            raise StackRunning(message) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the only descriptor releases the flock

    def held_elsewhere(self) -> bool:
        """Whether another process holds the lock now (a stack runs); creates nothing."""
        if not self.path.exists():
            return False
        try:
            self.acquire()
        except StackRunning:
            return True
        self.release()
        return False


def _holder_pid(fd: int) -> int | None:
    try:
        return int(os.pread(fd, 32, 0).decode().strip())
    except (OSError, ValueError):
        return None  # written by an older version, or not yet


def running_message(data_dir: Path) -> str:
    """Why a second stack cannot start on ``data_dir``, and how to stop the first."""
    try:
        state = read_state(data_dir)
    except StackError:
        state = None
    if state is None:
        return (
            f"a cdiflow stack is already running from {data_dir} but wrote no stack.json "
            "(it is still starting, or runs from Python); wait or stop that process, "
            "or use another --data-dir"
        )
    return (
        f"a cdiflow stack is already running from {data_dir} (supervisor pid "
        f"{state.supervisor.pid}, API {state.api_url}); stop it with "
        f"`cdiflow down --data-dir {data_dir}`, or use another --data-dir"
    )


def format_table(
    processes: tuple[ProcessInfo, ...] | list[ProcessInfo],
    data_dir: Path,
    *,
    show_state: bool = False,
) -> str:
    """A plain-text table: name, pid, [state,] address, log (relative to ``data_dir``)."""
    header = ["NAME", "PID", *(["STATE", "RESTARTS"] if show_state else []), "ADDRESS", "LOG"]
    rows = [header]
    for proc in processes:
        state = ("running" if proc.alive() else "gone") if proc.pid is not None else "external"
        if proc.restarting or (state == "gone" and proc.restarts):
            state = "restarting"
        log = proc.log
        if log and Path(log).is_relative_to(data_dir):
            log = str(Path(log).relative_to(data_dir))
        pid = str(proc.pid) if proc.pid is not None else "-"
        shown = [state, str(proc.restarts)] if show_state else []
        rows.append([proc.name, pid, *shown, proc.address or "-", log])
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(line.rstrip() for line in lines)
