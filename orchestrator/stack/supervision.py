"""A thread that restarts the stack's processes when they exit on their own.

Every piece is supervised the same way: the embedded Postgres, Redis and S3 endpoint, the CDI
controller and minion, the API, the scheduler and the workers. A restart of a service waits
until it answers again (Postgres may replay its log first), so each runs on a thread of its
own: a slow one never holds up the others. A process that keeps running but whose alive stamp
(``orchestrator.contract.alive``) stopped moving is stuck, not working: it is killed, which makes
it one that exited.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from cdi.child import describe_exit
from orchestrator.contract.alive import stamp_age
from orchestrator.stack.restarts import RestartPolicy

__all__ = ["Supervised", "Supervisor"]

log = logging.getLogger(__name__)


class Supervised(Protocol):
    """What the supervisor needs of a process: a ``ChildProcess``, a service, a CDI process."""

    @property
    def name(self) -> str: ...

    @property
    def pid(self) -> int | None: ...

    @property
    def log_path(self) -> Path | None: ...

    @property
    def started_at(self) -> float:
        """Monotonic time of the latest launch."""

    def poll(self) -> int | None:
        """None while it runs; its exit status once it ended."""

    def start(self) -> object:
        """Launch it again (a service returns once it answers); raise if it cannot."""


@dataclass
class _Watch:
    child: Supervised
    recent: deque[float] = field(default_factory=deque)  # monotonic times of restarts
    quick_crashes: int = 0
    restart_at: float | None = None  # set while a restart is pending
    restarting: bool = False  # a restart runs on its own thread
    restarts: int = 0  # since the stack started
    alive_file: Path | None = None  # its alive stamp, for a process that keeps one
    stalls: int = 0  # times it was killed for a stamp that stopped moving


class Supervisor:
    """Polls its children; one that ended is relaunched after the policy's back-off.

    Polling (not SIGCHLD) keeps signal handling with the main thread, which may be a CLI.
    Every ``interval`` (0.5 s: a restart waits at least 0.5 s of back-off anyway, and each look
    wakes the process holding the stack, the benchmark's driver among them).
    ``on_change`` runs when a child's exit is noticed and after each relaunch (the new PID is
    known), so that what ``cdiflow status`` shows follows. ``alive_files``: name -> the alive
    stamp of each child that keeps one.
    """

    def __init__(
        self,
        children: Iterable[Supervised],
        policy: RestartPolicy,
        *,
        on_change: Callable[[Supervised], None] | None = None,
        interval: float = 0.5,
        alive_files: Mapping[str, Path] | None = None,
    ) -> None:
        self.policy = policy
        self.on_change = on_change
        self.interval = interval
        files = alive_files or {}
        self._watches = {c.name: _Watch(c, alive_file=files.get(c.name)) for c in children}
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._restarters: list[threading.Thread] = []
        self._lock = threading.Lock()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="cdiflow-supervisor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop restarting (the children keep running); returns once every thread has ended,
        restarts under way included."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self._lock:
            restarters, self._restarters = self._restarters, []
        for thread in restarters:
            thread.join()

    def names(self) -> list[str]:
        return list(self._watches)

    def restarts(self, name: str) -> int:
        """How many times ``name`` was restarted."""
        return self._watches[name].restarts

    def stalls(self, name: str) -> int:
        """How many times ``name`` was killed because its alive stamp stopped moving."""
        return self._watches[name].stalls

    def restarting(self, name: str) -> bool:
        """Whether ``name`` has exited and waits for (or is in) its restart."""
        watch = self._watches[name]
        return watch.restarting or watch.restart_at is not None

    def _run(self) -> None:
        while not self._stopping.wait(self.interval):
            for watch in self._watches.values():
                try:
                    self._check(watch, time.monotonic())
                except Exception:  # keep supervising the others
                    log.exception("supervising %s failed", watch.child.name)

    def _check(self, watch: _Watch, now: float) -> None:
        child = watch.child
        if watch.restarting:
            return
        if watch.restart_at is None:
            status = child.poll()
            if status is None:
                self._check_stalled(watch, now)
                return
            self._schedule(watch, now, status)
            self._changed(child)
            return
        if now < watch.restart_at or self._stopping.is_set():
            return
        watch.restart_at = None
        watch.recent.append(now)
        watch.restarting = True
        thread = threading.Thread(
            target=self._restart, args=(watch,), name=f"restart-{child.name}", daemon=True
        )
        with self._lock:
            self._restarters = [t for t in self._restarters if t.is_alive()]
            self._restarters.append(thread)
        thread.start()

    def _check_stalled(self, watch: _Watch, now: float) -> None:
        child = watch.child
        if watch.alive_file is None or child.pid is None:
            return
        running = now - child.started_at
        age = stamp_age(watch.alive_file, running)
        # No stamp of its own yet (the age is its whole run): still starting.
        starting = age >= running
        limit = self.policy.stall_after
        if starting:
            limit = max(limit, self.policy.start_grace)
        if age <= limit:
            return
        watch.stalls += 1
        log.error("%s (pid %s) has not renewed %s for %.0fs: it is stuck; killing it so that it "
                  "restarts", child.name, child.pid, watch.alive_file, age)  # fmt: skip
        # Ours and not yet reaped (poll just said it runs), so the PID is still its own; if it
        # ended meanwhile, the next look restarts it.
        with contextlib.suppress(ProcessLookupError):
            os.kill(child.pid, signal.SIGKILL)

    def _schedule(self, watch: _Watch, now: float, status: int) -> None:
        child = watch.child
        ran = now - child.started_at
        watch.quick_crashes = 1 if ran >= self.policy.stable_after else watch.quick_crashes + 1
        while watch.recent and watch.recent[0] <= now - 60.0:
            watch.recent.popleft()
        delay = self.policy.delay(now, watch.recent, watch.quick_crashes)
        watch.restart_at = now + delay
        level = logging.WARNING
        if len(watch.recent) >= self.policy.max_per_minute:
            level = logging.ERROR
            log.error("%s restarted %d times in the last minute; holding off",
                      child.name, len(watch.recent))  # fmt: skip
        log.log(
            level,
            "%s (pid %s) exited with %s after %.1fs; restarting in %.1fs (log %s)",
            child.name, child.pid, describe_exit(status), ran, delay, child.log_path,
        )  # fmt: skip

    def _restart(self, watch: _Watch) -> None:
        child = watch.child
        try:
            if self._stopping.is_set():
                return
            began = time.monotonic()
            try:
                child.start()
            except Exception as exc:
                # Counts as a quick crash: back off further before the next try.
                log.error("could not restart %s: %s", child.name, exc)
                now = time.monotonic()
                watch.quick_crashes += 1
                watch.restart_at = now + self.policy.delay(now, watch.recent, watch.quick_crashes)
                return
            watch.restarts += 1
            log.warning("%s restarted (pid %s) in %.1fs",
                        child.name, child.pid, time.monotonic() - began)  # fmt: skip
        finally:
            watch.restarting = False
        self._changed(child)

    def _changed(self, child: Supervised) -> None:
        if self.on_change is None:
            return
        try:
            self.on_change(child)
        except Exception:
            log.exception("recording the change of %s failed", child.name)
