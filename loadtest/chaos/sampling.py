"""What a soak watches grow: each piece's memory and open files, Postgres's size, Redis's memory.

    with Sampler(target.stack, every_s=30) as sampler:
        ...                                   # the load
    sampler.samples, growth(sampler.samples, "rss:api", window_s=1800)

A piece is a row of the stack (``api``, ``scheduler-1``, ``worker-1``, ``cdi-minion``...) and
counts with its children (the minion's row is the Python wrapper of the native minion): its
resident memory (RSS) and its open file descriptors (files, sockets, pipes, shared memory).
Postgres's size is its database's (``pg_database_size``: tables and indexes, not the WAL, which
``max_wal_size`` bounds); Redis's memory is its ``used_memory``.
"""

from __future__ import annotations

import contextlib
import statistics
import threading
import time
from dataclasses import dataclass, field
from types import TracebackType
from typing import Final, Self

import psutil
import psycopg
import redis
from sqlalchemy import make_url

import cdi
from orchestrator.stack import Stack

__all__ = [
    "PIECES",
    "Growth",
    "LoopWatch",
    "MinionWatch",
    "Sample",
    "Sampler",
    "growth",
    "pieces_of",
]

PIECES: Final = ("api", "scheduler-1", "cdi-minion")  # and every worker


def pieces_of(stack: Stack) -> list[str]:
    return [*PIECES[:2], *stack.worker_ids, PIECES[2]]


@dataclass
class Sample:
    at_s: float  # seconds since sampling began
    values: dict[str, float] = field(default_factory=dict)  # "rss:api", "fds:api", ... -> value


@dataclass(frozen=True)
class Growth:
    """One measure over a window: its median at the start and at the end, and how much the
    end is above the start (percent)."""

    metric: str
    first: float
    last: float

    @property
    def percent(self) -> float:
        return 0.0 if self.first <= 0 else round(100.0 * (self.last - self.first) / self.first, 1)

    def as_dict(self) -> dict[str, float]:
        return {"first": self.first, "last": self.last, "percent": self.percent}


def growth(samples: list[Sample], metric: str, window_s: float, edge: float = 0.1) -> Growth:
    """``metric`` over the last ``window_s`` of ``samples``: the median of its first and of
    its last ``edge`` (a tenth) of the window, so one sample taken in a burst of garbage does
    not decide it."""
    if not samples:
        return Growth(metric, 0.0, 0.0)
    end = samples[-1].at_s
    start = max(samples[0].at_s, end - window_s)
    span = max(end - start, 1e-9)
    inside = [s for s in samples if s.at_s >= start and metric in s.values]
    head = [s.values[metric] for s in inside if s.at_s <= start + edge * span] or [
        inside[0].values[metric]
    ]
    tail = [s.values[metric] for s in inside if s.at_s >= end - edge * span] or [
        inside[-1].values[metric]
    ]
    return Growth(metric, statistics.median(head), statistics.median(tail))


class _Every:
    """Calls ``look()`` every ``every_s`` on a thread of its own, from ``with`` to its end."""

    def __init__(self, every_s: float) -> None:
        self.every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=type(self).__name__, daemon=True)
        self._began = 0.0

    def look(self) -> None:
        raise NotImplementedError

    def done(self) -> None:
        """After the last ``look()``."""

    def __enter__(self) -> Self:
        self._began = time.monotonic()
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join(60)
        self.done()

    def _run(self) -> None:
        while True:
            self.look()
            if self._stop.wait(self.every_s):
                return


class Sampler(_Every):
    """Takes a ``Sample`` every ``every_s`` into ``samples``."""

    def __init__(self, stack: Stack, every_s: float = 30.0) -> None:
        super().__init__(every_s)
        self.stack = stack
        self.samples: list[Sample] = []

    def look(self) -> None:
        self.samples.append(self.take())

    def take(self) -> Sample:
        sample = Sample(round(time.monotonic() - self._began, 1))
        for piece in pieces_of(self.stack):
            pid = self.stack.pid_of(piece)
            if pid is None:
                continue
            with contextlib.suppress(psutil.Error):
                rss, fds = _tree(pid)
                sample.values[f"rss:{piece}"] = rss
                sample.values[f"fds:{piece}"] = fds
        with contextlib.suppress(psycopg.Error):
            sample.values["postgres_bytes"] = _database_size(self.stack.services.database_url)
        with contextlib.suppress(redis.RedisError):
            client = redis.Redis.from_url(self.stack.services.redis_url)
            try:
                sample.values["redis_bytes"] = float(client.info("memory")["used_memory"])
            finally:
                client.close()
        return sample


def _tree(pid: int) -> tuple[float, float]:
    """RSS (bytes) and open descriptors of ``pid`` and its descendants."""
    root = psutil.Process(pid)
    rss = fds = 0
    for process in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            rss += process.memory_info().rss
            fds += process.num_fds()
    return float(rss), float(fds)


def _database_size(database_url: str) -> float:
    url = make_url(database_url)
    with psycopg.connect(
        host=url.host, port=url.port, user=url.username, password=url.password,
        dbname=url.database, connect_timeout=5,
    ) as conn:  # fmt: skip
        row = conn.execute("SELECT pg_database_size(current_database())").fetchone()
    assert row is not None
    return float(row[0])


class LoopWatch(_Every):
    """The longest time the scheduler's loop did not turn, from its alive stamp
    (``contract.alive``), looked at every ``every_s``: how long a fault held up every
    workflow. A process still starting (no stamp of its own yet) is not counted."""

    def __init__(self, stack: Stack, name: str = "scheduler-1", every_s: float = 0.25) -> None:
        super().__init__(every_s)
        self.stack = stack
        self.name = name
        self.stamp = stack.data_dir / "alive" / name
        self.longest_s = 0.0

    def look(self) -> None:
        pid = self.stack.pid_of(self.name)
        with contextlib.suppress(OSError, psutil.Error):
            running = time.time() - psutil.Process(pid).create_time() if pid else 0.0
            age = time.time() - self.stamp.stat().st_mtime
            if age < running:  # a stamp of this process's own
                self.longest_s = max(self.longest_s, round(age, 1))


class MinionWatch(_Every):
    """The longest time a minion of the stack answered no request, asked every ``every_s``
    (``stat`` on a connection of no container, made again once it fails): what a fault cost
    the minion's clients, apart from what the workflows do meanwhile. A minion whose launcher
    died serves on until its successor takes over, so its restart counts only the hand-over."""

    def __init__(self, stack: Stack, every_s: float = 0.01) -> None:
        super().__init__(every_s)
        self.sockets = [stack.cdi.socket_of(f"host{n}") for n in range(1, stack.hosts + 1)]
        self.longest_s = 0.0
        self._clients: dict[str, cdi.Client] = {}
        self._unanswered_since: dict[str, float] = {}

    def look(self) -> None:
        for path in self.sockets:
            now = time.monotonic()
            if self._answers(path):
                since = self._unanswered_since.pop(path, None)
                if since is not None:
                    self.longest_s = max(self.longest_s, round(now - since, 3))
            else:
                self._unanswered_since.setdefault(path, now)

    def _answers(self, path: str) -> bool:
        try:
            client = self._clients.get(path) or cdi.Client(path, timeout=1.0)
            self._clients[path] = client
            client.stat()
        except (cdi.CDIError, OSError):
            broken = self._clients.pop(path, None)
            if broken is not None:
                with contextlib.suppress(cdi.CDIError, OSError):
                    broken.close()
            return False
        return True

    def done(self) -> None:
        now = time.monotonic()
        for since in self._unanswered_since.values():  # still away at the end
            self.longest_s = max(self.longest_s, round(now - since, 3))
        for client in self._clients.values():
            with contextlib.suppress(cdi.CDIError, OSError):
                client.close()
