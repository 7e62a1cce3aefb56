"""What a minion with a state folder leaves for its successor, removed when it stops for good.

A minion started with ``--state-dir`` keeps its objects in a folder of its own under
``/dev/shm`` and its journal in the state folder, and names that segment folder in the state
folder's ``segments`` file (``cdi/minion-native/src/resume.rs``). A stop for good (SIGTERM)
removes all of it; a minion that did not get one does not: one killed with its launcher, or one
whose launcher died and which then stopped keeping its objects for a successor that never came
(docs/minion-restart.md). :func:`discard_kept` is what the stack, a cluster and a test run after
stopping a minion: it stops for good whatever minion still holds the folder, then removes what
the minion kept. A restart (``kill -9``, a successor taking over) never calls it, so the next
minion of the folder finds its objects.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Final

__all__ = ["JOURNAL_FILE", "LOCK_FILE", "SEGMENTS_FILE", "discard_kept", "segment_folder"]

log = logging.getLogger(__name__)

LOCK_FILE: Final = "lock"  # flock'd by the minion that holds the folder, its pid written in it
JOURNAL_FILE: Final = "journal"
SEGMENTS_FILE: Final = "segments"  # the segment folder's path, written by the minion
_SHM: Final = Path("/dev/shm")
_POLL_S: Final = 0.02


def segment_folder(state_dir: str | Path) -> Path | None:
    """The segment folder the minion of ``state_dir`` named (``None``: none named, or a name
    that is not a minion's folder under ``/dev/shm``)."""
    try:
        text = (Path(state_dir) / SEGMENTS_FILE).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    folder = Path(text)
    if folder.parent != _SHM or not folder.name.startswith(f"cdi-minion-{os.geteuid()}-"):
        return None
    return folder


def discard_kept(state_dir: str | Path, timeout: float = 10.0) -> None:
    """Stop for good any minion that still holds ``state_dir`` (SIGTERM; SIGKILL after
    ``timeout``), then remove its segment folder and journal. Nothing to do for a folder that
    does not exist."""
    folder = Path(state_dir)
    try:
        fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        fd = None  # no minion ever took the folder (or it is gone): only leftovers to remove
    except OSError as exc:
        log.warning("cannot open %s (%s); leaving the minion's memory in place", folder, exc)
        return
    try:
        if fd is not None and not _take(fd, folder, timeout):
            return
        segments = segment_folder(folder)
        if segments is not None:
            shutil.rmtree(segments, ignore_errors=True)
        for name in (JOURNAL_FILE, SEGMENTS_FILE):
            with contextlib.suppress(FileNotFoundError):
                (folder / name).unlink()
    finally:
        if fd is not None:
            os.close(fd)  # releases the lock


def _take(fd: int, folder: Path, timeout: float) -> bool:
    """Hold the folder's lock: ask each minion holding it to stop for good, kill one that
    outstays ``timeout``. False if it could not be had within twice that."""
    now = time.monotonic()
    kill_at, give_up_at = now + timeout, now + 2 * timeout
    asked: set[int] = set()
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            pass
        now = time.monotonic()
        if now >= give_up_at:
            log.warning("%s is still held; leaving the minion's memory in place", folder)
            return False
        pid = _holder(fd)
        if pid is not None and pid not in asked:
            log.info("minion %d still holds %s; stopping it for good", pid, folder)
            _signal(pid, signal.SIGTERM)
            asked.add(pid)
        elif pid is not None and now >= kill_at:
            log.warning("minion %d did not stop within %gs; killing it", pid, timeout)
            _signal(pid, signal.SIGKILL)
        time.sleep(_POLL_S)


def _holder(fd: int) -> int | None:
    """The pid the lock file names, if that process is a minion."""
    with contextlib.suppress(OSError, ValueError):
        pid = int(os.pread(fd, 32, 0).decode().strip())
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
        if pid > 0 and comm == "cdi-minion":
            return pid
    return None


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)
