"""What a worker's data planes are made of (``PlaneParts``), shared by every plane it runs."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import cdi
from orchestrator.objectstore import ObjectStore
from orchestrator.worker.held import HeldImages
from orchestrator.worker.input_cache_host import HostInputCache, InputStats

__all__ = ["LazyStore", "PlaneParts"]


class LazyStore:
    """The worker's one S3 store, made on first use (a worker that never touches S3 never
    makes a client)."""

    def __init__(self, make: Callable[[], ObjectStore]) -> None:
        self._make = make
        self._store: ObjectStore | None = None
        self._lock = threading.Lock()  # boto3 clients are thread-safe, their creation is not

    def __call__(self) -> ObjectStore:
        with self._lock:
            if self._store is None:
                self._store = self._make()
            return self._store


@dataclass(frozen=True)
class PlaneParts:
    """What a worker's planes are made of."""

    client: cdi.Client  # the worker's CDI client (its container)
    held: HeldImages  # images held in memory between a run's steps
    store: Callable[[], ObjectStore]  # the one S3 store of inputs, results and images
    access_timeout_s: float  # how long an object handed over is waited for
    max_input_bytes: int
    max_pixels: int
    input_cache: HostInputCache | None = None  # the host's input cache, when it is on
    input_stats: InputStats = field(default_factory=InputStats)  # inputs fetched, for metrics
