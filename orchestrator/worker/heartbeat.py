"""The worker's heartbeat: its load and liveness in ``keys.worker_key(id)``, refreshed in a thread.

The scheduler places tasks from these fields and presumes a worker dead once its hash is older
than ``keys.WORKER_DEAD_AFTER_S``; the hash also expires by itself (10 intervals), so a killed
worker does not linger in ``GET /api/workers`` as if alive.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable

import psutil
import redis
from redis.typing import EncodableT, FieldT

from orchestrator.contract import keys
from orchestrator.contract.alive import AliveStamp
from orchestrator.worker.input_cache_host import CacheFigures
from workflows.loader import TaskCatalog

__all__ = ["Heartbeat"]

log = logging.getLogger(__name__)

_EXPIRE_INTERVALS = 10


class Heartbeat:
    """HSETs this worker's fields every ``interval_s`` until ``stop``."""

    def __init__(
        self,
        client: redis.Redis,
        worker_id: str,
        *,
        running: Callable[[], int],
        held: Callable[[], tuple[int, int]] = lambda: (0, 0),
        input_cache: Callable[[], CacheFigures] | None = None,
        slots: int = 1,
        interval_s: float = keys.HEARTBEAT_INTERVAL_S,
        host: str | None = None,
        tasks: TaskCatalog | None = None,
    ) -> None:
        """``host``: the CDI host the worker's minion serves (what placement prices moves
        between); the machine's name when it has none. ``input_cache``: the host's input
        cache as this worker sees it, None when the cache is off."""
        self.client = client
        self.worker_id = worker_id
        self.key = keys.worker_key(worker_id)
        self.queue_key = keys.worker_queue_key(worker_id)
        self.interval_s = interval_s
        self._running = running
        self._held = held  # (images, bytes) held between tasks
        self._input_cache = input_cache
        self.slots = slots
        # Written with every beat: a Redis that lost its data learns it again within one.
        self.tasks = (tasks or TaskCatalog()).to_json()
        self.host = host or socket.gethostname()
        self.started_at = time.time()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._alive = AliveStamp.from_env()  # what the supervisor watches: the process turns
        self._process = psutil.Process()
        self._host_memory = psutil.virtual_memory().total
        psutil.cpu_percent(interval=None)  # prime them: the first reading compares with nothing
        self._process.cpu_percent(interval=None)

    def fields(self) -> dict[str, str]:
        """The ``keys.WORKER_FIELDS`` as strings, read now."""
        values = {
            "cpu": f"{psutil.cpu_percent(interval=None):.1f}",
            "mem": f"{psutil.virtual_memory().percent:.1f}",
            "queue_depth": str(self.client.llen(self.queue_key)),
            "running": str(self._running()),
            "slots": str(self.slots),
            "host": self.host,
            "last_heartbeat": f"{time.time():.3f}",
            "started_at": f"{self.started_at:.3f}",
        }
        values["held_images"], values["held_bytes"] = (str(n) for n in self._held())
        values["tasks"] = self.tasks
        # The process's own figures: on a shared host, the host's say nothing of this worker.
        with self._process.oneshot():
            values["proc_cpu"] = f"{self._process.cpu_percent(interval=None):.1f}"
            rss = self._process.memory_info().rss
            values["proc_rss"] = str(rss)
            values["proc_mem"] = f"{100.0 * rss / self._host_memory:.1f}"
        values.update(_cache_fields(None if self._input_cache is None else self._input_cache()))
        assert tuple(values) == keys.WORKER_FIELDS, "keep in step with keys.WORKER_FIELDS"
        return values

    def beat(self) -> None:
        """Write one heartbeat; raises ``redis.RedisError`` when Redis cannot be reached."""
        fields = self.fields()
        pipe = self.client.pipeline(transaction=True)
        mapping: dict[FieldT, EncodableT] = {k: v for k, v in fields.items()}
        pipe.hset(self.key, mapping=mapping)
        pipe.pexpire(self.key, int(self.interval_s * _EXPIRE_INTERVALS * 1000))
        pipe.sadd(keys.WORKERS, self.worker_id)
        pipe.execute()

    def start(self) -> None:
        """Beat once now (so the worker is visible before it pops), then in a thread."""
        self._alive.renew()
        self.beat()
        self._thread = threading.Thread(target=self._loop, name="heartbeat", daemon=True)
        self._thread.start()

    def stop(self, *, remove: bool = True) -> None:
        """Stop beating and, if ``remove``, delete the hash: a worker that left is not alive."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if remove:
            try:
                self.client.delete(self.key)
            except redis.RedisError as exc:
                log.warning(
                    "could not delete heartbeat %s (it expires by itself): %s", self.key, exc
                )

    def _loop(self) -> None:
        failing = False
        while not self._stop.wait(self.interval_s):
            self._alive.renew()  # the process turns, whether or not Redis answers
            try:
                self.beat()
            except redis.RedisError as exc:
                if not failing:  # once per outage, not every interval
                    log.warning("heartbeat failed, retrying every %gs: %s", self.interval_s, exc)
                failing = True
                continue
            except Exception:
                log.exception("heartbeat failed unexpectedly")
                continue
            if failing:
                log.info("heartbeat restored")
                failing = False


def _cache_fields(figures: CacheFigures | None) -> dict[str, str]:
    """The ``input_cache_*`` fields: empty strings when the cache is off."""
    names = ("hits", "misses", "saved_bytes", "s3_bytes", "holder", "entries", "bytes")
    if figures is None:
        return {f"input_cache_{name}": "" for name in names}
    return {f"input_cache_{name}": str(int(getattr(figures, name))) for name in names}
