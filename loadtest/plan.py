"""What one benchmark run measures: scenario points, and the target handed to locust.

A *point* is one configuration of a scenario (sizes drawn from, tasks, concurrency); every
system runs every point. Concurrency is closed-loop: ``concurrency`` simulated users each run
``rounds`` workflows back to back, so at most ``concurrency`` are in flight.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

from loadtest.images import SCENARIO2_SIZES
from loadtest.pipeline_ops import DEFAULT_INTERMEDIATE

__all__ = [
    "DEFAULT_CONCURRENCY",
    "DEFAULT_SIZES",
    "DEFAULT_TASKS",
    "PARALLEL",
    "SCENARIOS",
    "SEED",
    "Point",
    "Target",
    "client_usage_path",
    "plan_points",
    "poll_max_s",
]

SCENARIOS: Final = ("1", "2", "3")
DEFAULT_SIZES: Final = (10_000, 100_000, 500_000, 2_000_000)  # scenario 1
DEFAULT_CONCURRENCY: Final = (1, 50, 100, 200, 500)  # scenario 2
DEFAULT_TASKS: Final = (1, 3, 6, 10)  # scenario 3
PARALLEL: Final = 10  # scenarios 1 and 3: "10 workflows in parallel"
SCENARIO3_SIZE: Final = 2_000_000
SEED: Final = 1  # users draw images from random.Random(SEED * 100_003 + user index)


@dataclass(frozen=True)
class Point:
    scenario: str
    sizes: tuple[int, ...]  # the images drawn from (one size: every workflow gets it)
    tasks: int
    concurrency: int  # closed loop: workflows in flight (an open-loop point keeps its own)
    rounds: int
    # Workflows started per second, whatever the system's pace (an open loop of
    # ``workflows`` of them); 0: the closed loop.
    arrival_rate: float = 0.0
    load: float | None = None  # open loop: the rate as a share of the closed loop's throughput

    @property
    def size(self) -> int | None:
        return self.sizes[0] if len(self.sizes) == 1 else None

    @property
    def workflows(self) -> int:
        return self.concurrency * self.rounds

    def label(self) -> str:
        size = f"{self.size / 1000:g}KB" if self.size else "mixed"
        shape = f"r{self.arrival_rate:.3g}" if self.arrival_rate else f"c{self.concurrency}"
        return f"s{self.scenario} {size} x{self.tasks} {shape}"


def _rounds(concurrency: int, min_workflows: int) -> int:
    return max(1, math.ceil(min_workflows / concurrency))


def plan_points(
    scenario: str,
    *,
    sizes: tuple[int, ...] = DEFAULT_SIZES,
    concurrency: tuple[int, ...] = DEFAULT_CONCURRENCY,
    tasks: tuple[int, ...] = DEFAULT_TASKS,
    min_workflows: int = 30,
    mixed_sizes: tuple[int, ...] = SCENARIO2_SIZES,
    parallel: int = PARALLEL,
) -> list[Point]:
    """The points of one scenario; each runs at least ``min_workflows`` workflows.

    Scenario 1 uses ``sizes`` (``parallel`` users, 3 tasks); scenario 2 ``concurrency``
    (images drawn from ``mixed_sizes``); scenario 3 ``tasks`` (2 MB, ``parallel`` users, or
    the first of ``sizes`` if it was narrowed to one).
    """
    rounds = _rounds(parallel, min_workflows)
    if scenario == "1":
        return [Point("1", (s,), 3, parallel, rounds) for s in sizes]
    if scenario == "2":
        return [Point("2", mixed_sizes, 3, c, _rounds(c, min_workflows)) for c in concurrency]
    if scenario == "3":
        size = sizes[0] if len(sizes) == 1 else SCENARIO3_SIZE
        return [Point("3", (size,), t, parallel, rounds) for t in tasks]
    raise ValueError(f"unknown scenario {scenario!r}; choose from {SCENARIOS}")


def poll_max_s(concurrency: int) -> float:
    """Longest pause between two status polls of one workflow: 1 s, longer past 100 users.

    Clients wait for a workflow's end the way its system tells them (a long poll, a
    subscription, a synchronous start); they poll only after such a wait failed, or, for
    Conductor, once a workflow outlived the start's wait. Polls take the CPU the workflows
    need on two cores, so the pause grows from 50 ms to this cap, keeping the whole crowd
    under ~100 polls a second. Latency never depends on it (it is the system's own "stored"
    stamp); how late a client noticed is recorded (``WorkflowRecord.noticed_at``).
    """
    return min(5.0, max(1.0, concurrency / 100))


@dataclass
class Target:
    """Everything the locust process needs for one point, as a JSON file."""

    system: str
    images: list[tuple[str, int]]  # (S3 URI, size in bytes)
    tasks: int
    concurrency: int
    rounds: int  # workflows per user; 0: until locust stops the run (web UI)
    records: str  # JSON-lines file, one WorkflowRecord per workflow
    api_url: str = ""  # cdiflow
    api_key: str = ""  # cdiflow: the key the users send (the file is written mode 0600)
    workflow: str = ""  # cdiflow workflow name
    celery_broker: str = ""
    celery_backend: str = ""
    seed: int = SEED
    poll_first_s: float = 0.05
    poll_max_s: float = 1.0
    timeout_s: float = 900.0  # one workflow; past it the record says TIMEOUT
    intermediate: str = DEFAULT_INTERMEDIATE  # how S3-passing systems store images between tasks
    # Workflows started per second (an open loop: ``rounds`` of them, ``concurrency`` 1);
    # 0: the closed loop (``concurrency`` users, ``rounds`` each).
    arrival_rate: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def write(self, path: Path) -> None:
        # Private: it may hold an API key.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(json.dumps(asdict(self), indent=1))

    @classmethod
    def read(cls, path: Path) -> Target:
        data = json.loads(path.read_text())
        data["images"] = [(str(u), int(s)) for u, s in data["images"]]
        return cls(**data)


def client_usage_path(records: str | Path) -> Path:
    """Where locust writes its own CPU and memory for a point (beside its records file)."""
    return Path(f"{records}.client-usage.json")
