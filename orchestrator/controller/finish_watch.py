"""Long polls: requests that wait for a workflow to finish, woken by the scheduler's publish.

Schedulers (and the API's cancel) PUBLISH a workflow's id on ``keys.FINISHED`` once its end is
committed. One thread per API process listens and wakes the requests waiting for that id
(``GET /api/workflows/{id}?wait_s=…``). *Why:* a client that polls every few milliseconds
takes the CPU the workflow needs on a small machine, and 500 of them swamp the API; a waiting
request costs nothing until the answer is ready. A publish is a hint, like every wake-up in
Redis: waiters look at Postgres again after ``RECHECK_S``, then at doubling intervals up to
``RECHECK_MAX_S``, and every waiter looks once whenever the subscription is made again (what
was published while it was down is lost). *Why the long ceiling:* at 500 waiting requests, a
look every 5 s was 100 status queries a second — the API's CPU per workflow rose from 15 to
60 ms and throughput fell 12-17 % from its peak (``cdiflow bench workflows --scenario 2``); a
publish lost otherwise (a scheduler dying between its commit and its publish) costs its
waiter at most 30 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterator
from typing import Final, TypeVar

import redis

from orchestrator import keys

__all__ = ["RECHECK_MAX_S", "RECHECK_S", "FinishWatch"]

log = logging.getLogger(__name__)

T = TypeVar("T")

RECHECK_S: Final = 1.0  # a waiter looks at Postgres again after this, then less and less often
RECHECK_MAX_S: Final = 30.0
_RECONNECT_S: Final = 1.0


class FinishWatch:
    """One Redis subscription for every waiting request of this process."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client
        self._waiters: defaultdict[str, set[tuple[asyncio.AbstractEventLoop, asyncio.Event]]]
        self._waiters = defaultdict(set)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._listen, name="finish-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2 * _RECONNECT_S)

    @contextlib.contextmanager
    def listen(self, workflow_id: uuid.UUID) -> Iterator[asyncio.Event]:
        """Register for ``workflow_id``'s announcements: the event is set on each one. Listen
        before looking (or before starting the run), so no announcement falls in between."""
        waiter = (asyncio.get_running_loop(), asyncio.Event())
        key = str(workflow_id)
        with self._lock:
            self._waiters[key].add(waiter)
        try:
            yield waiter[1]
        finally:
            with self._lock:
                waiting = self._waiters.get(key)
                if waiting is not None:
                    waiting.discard(waiter)
                    if not waiting:
                        del self._waiters[key]

    async def wait(
        self,
        workflow_id: uuid.UUID,
        timeout_s: float,
        finished: Callable[[bool], Awaitable[T | None]],
    ) -> T | None:
        """``finished(announced)``'s first answer that is not ``None`` (it says the workflow
        ended), or ``None`` once ``timeout_s`` has passed. It is asked at once, on every
        announcement for ``workflow_id`` (``announced=True``: most likely over, so a caller can
        skip a cheap look and build its answer) and every ``RECHECK_S``."""
        with self.listen(workflow_id) as woken:
            return await self.until(woken, timeout_s, finished)

    @staticmethod
    async def until(
        woken: asyncio.Event,
        timeout_s: float,
        finished: Callable[[bool], Awaitable[T | None]],
        *,
        look_first: bool = True,
    ) -> T | None:
        """``wait`` for a caller already listening (``listen``). ``look_first=False``: the run
        was started after listening began, so nothing can have ended it unannounced yet and
        the first look waits for an announcement (or ``RECHECK_S``)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        recheck = RECHECK_S
        look, announced = look_first, False
        while True:
            if look:
                woken.clear()  # before looking: an announcement during the look wakes the wait
                answer = await finished(announced)
                if answer is not None:
                    return answer
            look = True
            remaining = deadline - loop.time()
            if remaining <= 0:
                return None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(woken.wait(), min(remaining, recheck))
            announced = woken.is_set()
            recheck = min(RECHECK_MAX_S, recheck * 2)

    def _wake(self, key: str) -> None:
        with self._lock:
            waiting = list(self._waiters.get(key, ()))
        for loop, event in waiting:
            loop.call_soon_threadsafe(event.set)

    def _wake_all(self) -> None:
        with self._lock:
            waiting = [w for ws in self._waiters.values() for w in ws]
        for loop, event in waiting:
            loop.call_soon_threadsafe(event.set)

    def _listen(self) -> None:
        lost = False  # True after a failure: announcements may have gone by unheard
        while not self._stop.is_set():
            pubsub = self._client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
            try:
                pubsub.subscribe(keys.FINISHED)
                if lost:
                    self._wake_all()  # each waiter looks once at what it may have missed
                    lost = False
                while not self._stop.is_set():
                    message = pubsub.get_message(timeout=RECHECK_S)
                    if message is not None and message.get("type") == "message":
                        self._wake(str(message["data"]))
            except redis.RedisError as exc:
                log.warning("finish notifications lost (%s); waiters fall back to polling", exc)
                lost = True
                self._stop.wait(_RECONNECT_S)
            finally:
                pubsub.close()
