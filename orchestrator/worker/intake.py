"""A worker's reliable pop: up to its free slots' worth of instructions in one Redis call.

Every instruction popped is moved, in the same command, from the worker's queue
(``keys.worker_queue_key``) into its in-flight list, where it stays until its report
acknowledges it (``replies``): a worker killed with instructions popped loses none, the
scheduler finds them there. One free slot at a time pops for all the free ones: with one free
it waits on the queue (BLMOVE); with several it first moves as many as are waiting, up to that
many, in one script call (waiting on the queue only when it is empty), keeps one and leaves
the others to the free slots that come next. It pops no more than the slots free, so no
instruction waits here behind a busy slot; once the worker stops, the slots still run what was
popped before they end.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Final

import redis

from orchestrator.contract.scripts import MOVE_UP_TO

__all__ = ["POP_TIMEOUT_S", "Intake"]

log = logging.getLogger(__name__)

POP_TIMEOUT_S: Final = 1  # how often a slot waiting on the queue looks at the stop flag
_REDIS_DOWN_RETRY_S: Final = 1.0

# KEYS: the queue, the in-flight list; ARGV: how many at most. Oldest first.
_TAKE = MOVE_UP_TO + "return taken\n"


class Intake:
    """Instructions for ``slots`` slots. ``client``: the calling thread's Redis client (bytes
    replies: an acknowledgement must match the instruction exactly); ``stop``: set when the
    worker stops popping."""

    def __init__(
        self,
        redis_client: redis.Redis,
        queue_key: str,
        inflight_key: str,
        slots: int,
        client: Callable[[], redis.Redis],
        stop: threading.Event,
    ) -> None:
        self.queue_key = queue_key
        self.inflight_key = inflight_key
        self.slots = slots
        self._client = client
        self._stop = stop
        self._take = redis_client.register_script(_TAKE)
        self._popping = threading.Lock()  # held by the slot that pops for the free ones
        self._popped: deque[bytes] = deque()  # popped for free slots, not yet taken
        self._busy = 0  # slots running an instruction

    def load(self) -> None:
        """Load the script into Redis now, so that its first call needs no second try (Redis
        answers NOSCRIPT to a script it has not seen, and redis-py then sends it)."""
        self._take.registered_client.script_load(self._take.script)

    def next(self, *, done: bool = False) -> bytes | None:
        """The calling slot's next instruction (``done``: it has run the one before); None once
        the worker stops and nothing popped is left."""
        with self._popping:
            if done:
                self._busy -= 1
            while not self._popped:
                if self._stop.is_set():
                    return None
                self._pop(self.slots - self._busy)
            self._busy += 1
            return self._popped.popleft()

    def _pop(self, free: int) -> None:
        client = self._client()
        try:
            if free > 1:
                self._popped.extend(self._take(keys=[self.queue_key, self.inflight_key],
                                               args=[free], client=client))  # fmt: skip
                if self._popped:
                    return
            raw = client.blmove(
                self.queue_key, self.inflight_key, POP_TIMEOUT_S, src="RIGHT", dest="LEFT"
            )
        except redis.RedisError as exc:
            log.warning("cannot pop %s: %s; retrying", self.queue_key, exc)
            self._stop.wait(_REDIS_DOWN_RETRY_S)
            return
        if isinstance(raw, bytes):
            self._popped.append(raw)
