"""Which worker runs a task: live metrics, the workflow's policy and a small cost model.

Metrics come from worker heartbeats in Redis (CPU, memory, queue depth, running tasks) and from
the scheduler's own count of instructions it sent that have not come back yet (heartbeats are up
to two seconds old; without that count a burst of placements would all land on the same worker).

Policies:
* ``affinity`` (paper option 1): the first task goes to the least-loaded worker; every later task
  of the workflow goes to that same worker, which keeps the CDI ownership between tasks.
* ``transfer`` (paper option 2): every task goes to the least-loaded worker.
* ``auto``: stay on the previous task's worker unless its expected wait exceeds the best worker's
  expected wait plus the cost of moving. Expected wait = (queued + running + in flight) x the
  mean run time of that task; moving costs two hand-offs plus the bytes at memory bandwidth (an
  allowance for caches gone cold; zero-copy on one host, a real copy across hosts).
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["WorkerLoad", "choose_worker", "move_cost_s", "read_workers"]

HANDOFF_S = 0.0003  # one same-host CDI hand-off, measured with `cdiflow bench cdi`
MEMORY_BANDWIDTH_BPS = 2e9


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

    @property
    def backlog(self) -> int:
        return max(self.queue_depth + self.running, self.in_flight)

    def score(self) -> float:
        """Lower is better: tasks ahead of a new one, then CPU as a tie-breaker."""
        return self.backlog + self.cpu / 1000.0 + self.mem / 10000.0


def read_workers(
    heartbeats: Mapping[str, Mapping[str, str]],
    in_flight: Mapping[str, int],
    dead_after_s: float,
    now: float | None = None,
) -> list[WorkerLoad]:
    """Turn heartbeat hashes into loads; malformed fields read as 'not alive'."""
    now = time.time() if now is None else now
    loads = []
    for worker_id, fields in heartbeats.items():
        try:
            last = float(fields.get("last_heartbeat", "0"))
            load = WorkerLoad(
                worker_id=worker_id,
                alive=now - last <= dead_after_s,
                cpu=float(fields.get("cpu", "0")),
                mem=float(fields.get("mem", "0")),
                queue_depth=int(fields.get("queue_depth", "0")),
                running=int(fields.get("running", "0")),
                in_flight=in_flight.get(worker_id, 0),
                started_at=float(fields.get("started_at", "0")),
            )
        except ValueError:
            load = WorkerLoad(worker_id, False, 0, 0, 0, 0, in_flight.get(worker_id, 0))
        loads.append(load)
    return loads


def move_cost_s(nbytes: int) -> float:
    return 2 * HANDOFF_S + nbytes / MEMORY_BANDWIDTH_BPS


def choose_worker(
    workers: Sequence[WorkerLoad],
    policy: str,
    previous: str | None,
    *,
    task_s: float,
    nbytes: int,
    rng: random.Random | None = None,
    avoid: frozenset[str] = frozenset(),
) -> str | None:
    """The worker for the next task, or ``None`` when no worker is alive. Workers in ``avoid``
    (one that just lost this task) are used only when no other is alive."""
    alive = [w for w in workers if w.alive and w.worker_id not in avoid] or [
        w for w in workers if w.alive
    ]
    if not alive:
        return None
    rng = rng or random.Random()
    best_score = min(w.score() for w in alive)
    best = rng.choice([w for w in alive if w.score() == best_score])
    current = next((w for w in alive if w.worker_id == previous), None)
    if current is None or policy == "transfer":
        return best.worker_id
    if policy == "affinity":
        return current.worker_id
    # auto: compare expected waits
    wait_here = current.backlog * task_s
    wait_there = best.backlog * task_s + move_cost_s(nbytes)
    return current.worker_id if wait_here <= wait_there else best.worker_id
