"""A thread that restarts the scheduler and workers when they exit on their own."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from orchestrator.child_process import ChildProcess, describe_exit
from orchestrator.stack.restarts import RestartPolicy

__all__ = ["Supervisor"]

log = logging.getLogger(__name__)


@dataclass
class _Watch:
    child: ChildProcess
    recent: deque[float] = field(default_factory=deque)  # monotonic times of restarts
    quick_crashes: int = 0
    restart_at: float | None = None  # set while a restart is pending
    restarts: int = 0  # since the stack started


class Supervisor:
    """Polls its children; one that ended is relaunched after the policy's back-off.

    Polling (not SIGCHLD) keeps signal handling with the main thread, which may be a CLI.
    Every ``interval`` (0.5 s: a restart waits at least 0.5 s of back-off anyway, and each look
    wakes the process holding the stack, the benchmark's driver among them).
    ``on_restart`` runs on the supervisor thread after each relaunch (the new PID is known).
    """

    def __init__(
        self,
        children: Iterable[ChildProcess],
        policy: RestartPolicy,
        *,
        on_restart: Callable[[ChildProcess], None] | None = None,
        interval: float = 0.5,
    ) -> None:
        self.policy = policy
        self.on_restart = on_restart
        self.interval = interval
        self._watches = {child.name: _Watch(child) for child in children}
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="cdiflow-supervisor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop restarting (the children keep running); returns once the thread has ended."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def restarts(self, name: str) -> int:
        """How many times ``name`` was restarted."""
        return self._watches[name].restarts

    def _run(self) -> None:
        while not self._stopping.wait(self.interval):
            for watch in self._watches.values():
                try:
                    self._check(watch, time.monotonic())
                except Exception:  # keep supervising the others
                    log.exception("supervising %s failed", watch.child.name)

    def _check(self, watch: _Watch, now: float) -> None:
        child = watch.child
        if watch.restart_at is None:
            status = child.poll()
            if status is None:
                return
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
            return
        if now < watch.restart_at or self._stopping.is_set():
            return
        watch.restart_at = None
        watch.recent.append(now)
        try:
            child.start()
        except OSError:
            # Counts as a quick crash: the next check finds it ended and backs off further.
            log.exception("could not restart %s", child.name)
            watch.quick_crashes += 1
            watch.restart_at = now + self.policy.delay(now, watch.recent, watch.quick_crashes)
            return
        watch.restarts += 1
        log.info("%s restarted (pid %s)", child.name, child.pid)
        if self.on_restart is not None:
            self.on_restart(child)
