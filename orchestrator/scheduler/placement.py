"""What placement weighs: the workers' loads, and what moving an object to one costs.

Loads come from worker heartbeats in Redis (CPU, memory, queue depth, running tasks) and from
the scheduler's own count of instructions it sent that have not come back yet (heartbeats are up
to two seconds old; without that count a burst of placements would all land on the same worker).
Which worker a step goes to is its run's policy's choice (``policies``).

Hosts: each worker's heartbeat names its CDI host. Workers are compared by expected wait plus
what moving the object to them costs (``Route``, ``move_cost_s``), so of two equally loaded
workers the one on the object's host wins, and a worker on another host wins when its queue is
shorter by more than the crossing costs.

Late binding: a task that is free to go anywhere (every task under ``transfer`` and ``auto``,
the first under ``affinity``) is sent only to a worker with *room*: fewer of this scheduler's
instructions in flight there than its slots plus a short prefetch (``has_room``). Otherwise it
waits in the scheduler, which places it when a report frees a slot. *Why:* a task pushed into a
worker's queue is bound to that worker; with long tasks (large images) one worker then
idled while the other had a backlog of bound tasks (``workers_busy`` of ``cdiflow bench
workflows`` shows each worker's busy share).
The prefetch hides the round trip between a report and the next push; with short tasks it
grows so large that nothing waits (``PREFETCH_S``). Tasks pinned to a worker are not
held: they can run nowhere else.

Capable workers only: a worker announces the task modules it loaded (the heartbeat's
``tasks``, ``workflows.loader.TaskCatalog``), and a task goes only to a worker that loaded its
module (``capable``). Workers need not all run the same code: one pool may load the GPU tasks,
another the rest.
"""

from __future__ import annotations

import functools
import itertools
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from workflows.loader import TaskCatalog

__all__ = [
    "PREFETCH_S",
    "Link",
    "Route",
    "WorkerLoad",
    "capable",
    "loaded_modules",
    "move_cost_s",
    "read_workers",
]

HANDOFF_S = 0.0003  # one same-host CDI hand-off, measured with `cdiflow bench cdi`
MEMORY_BANDWIDTH_BPS = 2e9
# Work queued at a worker beyond its running tasks: at least one task, else this many seconds
# of the task being placed (enough to hide the report-to-push round trip behind short tasks).
PREFETCH_S = 0.1


@dataclass
class Link:
    """What crossing between two hosts costs: bandwidth and round trip.

    Starts from ``CDIFLOW_LINK_MBIT`` (default 1000) and ``CDIFLOW_LINK_RTT_MS`` (0.5) and
    learns from each cross-host transfer the scheduler makes: a small one (< 64 KB) is mostly
    round trip, a large one (>= 1 MB) mostly bandwidth; each moves its estimate a fifth of the
    way."""

    bytes_per_s: float = 125e6
    rtt_s: float = 0.0005

    @classmethod
    def from_env(cls) -> Link:
        return cls(
            float(os.environ.get("CDIFLOW_LINK_MBIT", "1000")) * 1e6 / 8,
            float(os.environ.get("CDIFLOW_LINK_RTT_MS", "0.5")) / 1000,
        )

    def cost_s(self, nbytes: int) -> float:
        return self.rtt_s + nbytes / self.bytes_per_s

    def observe(self, nbytes: int, seconds: float) -> None:
        if seconds <= 0:
            return
        if nbytes < 64_000:
            self.rtt_s = 0.8 * self.rtt_s + 0.2 * seconds
        elif nbytes >= 1_000_000 and seconds > self.rtt_s:
            self.bytes_per_s = 0.8 * self.bytes_per_s + 0.2 * nbytes / (seconds - self.rtt_s)


@dataclass(frozen=True)
class WorkerLoad:
    worker_id: str
    alive: bool
    cpu: float
    mem: float
    queue_depth: int
    running: int
    in_flight: int  # instructions this scheduler sent that have not been reported yet
    started_at: float = 0.0  # when the worker process started: a change means it restarted
    slots: int = 1  # tasks the worker runs at once (its --concurrency)
    host: str = ""  # its CDI host; "" when unknown (then it is taken to share the object's)
    modules: frozenset[str] = frozenset()  # the task modules it loaded

    @property
    def backlog(self) -> int:
        return max(self.queue_depth + self.running, self.in_flight)

    def has_room(self, task_s: float) -> bool:
        """Whether a task expected to take ``task_s`` may be queued here now: this scheduler's
        count only (heartbeats are too old to gate on; other schedulers' tasks just queue)."""
        prefetch = max(1, int(PREFETCH_S / task_s)) if task_s > 0 else 1_000_000
        return self.in_flight < self.slots + prefetch

    def score(self) -> float:
        """Lower is better: tasks ahead of a new one, then CPU as a tie-breaker."""
        return self.backlog + self.cpu / 1000.0 + self.mem / 10000.0


def read_workers(
    heartbeats: Mapping[str, Mapping[str, str]],
    in_flight: Mapping[str, int],
    dead_after_s: float,
    now: float | None = None,
    reported_at: Mapping[str, float] | None = None,
) -> list[WorkerLoad]:
    """Turn heartbeat hashes into loads; malformed fields read as 'not alive'.

    ``reported_at``: when this scheduler last had a report from each worker (unix seconds).
    A heartbeat older than that counts tasks since reported: its queue and running counts are
    left out, and this scheduler's own ``in_flight`` (always current) stands. *Why:* right
    after a step, its worker's last beat (up to 2 s old) still says it is busy, and a join's
    or a fork's next steps would all go to the other worker."""
    now = time.time() if now is None else now
    reported = reported_at or {}
    loads = []
    for worker_id, fields in heartbeats.items():
        try:
            last = float(fields.get("last_heartbeat", "0"))
            stale = last < reported.get(worker_id, 0.0)
            load = WorkerLoad(
                worker_id=worker_id,
                alive=now - last <= dead_after_s,
                cpu=float(fields.get("cpu", "0")),
                mem=float(fields.get("mem", "0")),
                queue_depth=0 if stale else int(fields.get("queue_depth", "0")),
                running=0 if stale else int(fields.get("running", "0")),
                in_flight=in_flight.get(worker_id, 0),
                started_at=float(fields.get("started_at", "0")),
                slots=max(1, int(fields.get("slots", "1"))),
                host=fields.get("host", ""),
                modules=loaded_modules(fields.get("tasks", "")),
            )
        except ValueError:
            load = WorkerLoad(worker_id, False, 0, 0, 0, 0, in_flight.get(worker_id, 0))
        loads.append(load)
    return loads


@functools.lru_cache(maxsize=256)
def loaded_modules(catalog_json: str) -> frozenset[str]:
    """The modules a heartbeat's ``tasks`` says the worker loaded (the same text arrives with
    every beat, so each distinct one is parsed once)."""
    return frozenset(TaskCatalog.from_json(catalog_json).modules) if catalog_json else frozenset()


def capable(workers: Sequence[WorkerLoad], module_path: str) -> list[WorkerLoad]:
    """The workers that loaded the module of ``package.module:function``."""
    module = module_path.partition(":")[0]
    return [w for w in workers if module in w.modules]


def move_cost_s(nbytes: int, crossings: int = 0, link: Link | None = None) -> float:
    """Moving an object of ``nbytes`` to another worker, crossing ``crossings`` host
    boundaries on the way."""
    crossing = crossings * (link or Link()).cost_s(nbytes) if crossings else 0.0
    return 2 * HANDOFF_S + nbytes / MEMORY_BANDWIDTH_BPS + crossing


@dataclass(frozen=True)
class Route:
    """Where the object is and who holds it between tasks, for pricing a move: ``here`` the
    host the object is on now, ``hub`` the host it passes through on its way: the scheduler's,
    or ``here`` for one handed on straight from worker to worker (``PlacementPolicy.hands_on``)."""

    here: str = ""
    hub: str = ""
    link: Link | None = None

    def crossings(self, to: str) -> int:
        if not to or not self.hub:
            return 0
        via = [h for h in (self.here, self.hub, to) if h]
        return sum(1 for a, b in itertools.pairwise(via) if a != b)
