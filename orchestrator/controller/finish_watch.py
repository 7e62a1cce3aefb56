"""Long polls: requests that wait for a workflow to finish, woken by the scheduler's publish.

Schedulers (and the API's cancel) PUBLISH a workflow's id on ``keys.FINISHED`` once its end is
committed. One thread per API process listens and wakes the requests waiting for that id
(``GET /api/workflows/{id}?wait_s=…``). *Why:* a client that polls every few milliseconds
takes the CPU the workflow needs on a small machine, and 500 of them swamp the API; a waiting
request costs nothing until the answer is ready.

A publish is a hint, like every wake-up in Redis (a scheduler may die between its commit and
its publish; Redis may drop the subscription). So a second thread sweeps: every ``SWEEP_S`` it
asks Postgres, in one query, which of the awaited runs have ended, and wakes their waiters.
*Why one sweep and not a look per waiter:* waiters that each looked again on a timer cost the
API one query per waiter per interval, so its CPU per workflow grew with the number waiting
(13 ms at 50 concurrent, 102 ms at 500: ``cdiflow bench workflows --scenario 2``); the sweep
costs one query a second however many wait (12 and 29 ms in the same benchmark).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable, Collection, Iterator
from typing import Final, TypeVar

import redis

from orchestrator.contract import keys

__all__ = ["SWEEP_S", "EndedAmong", "FinishWatch"]

log = logging.getLogger(__name__)

T = TypeVar("T")

EndedAmong = Callable[[Collection[uuid.UUID]], Collection[uuid.UUID]]
"""Which of these runs have ended (one database query)."""

SWEEP_S: Final = 1.0  # how late a lost announcement reaches its waiter, at worst
_RECONNECT_S: Final = 1.0


class FinishWatch:
    """One Redis subscription and one sweep for every waiting request of this process."""

    def __init__(self, client: redis.Redis, ended_among: EndedAmong) -> None:
        self._client = client
        self._ended_among = ended_among
        self._waiters: defaultdict[str, set[tuple[asyncio.AbstractEventLoop, asyncio.Event]]]
        self._waiters = defaultdict(set)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._listen, name="finish-watch", daemon=True),
            threading.Thread(target=self._sweep, name="finish-sweep", daemon=True),
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            if thread.is_alive():
                thread.join(timeout=2 * _RECONNECT_S)

    def waiting(self) -> int:
        """Requests of this process waiting for a run to end now."""
        with self._lock:
            return sum(len(waiters) for waiters in self._waiters.values())

    @contextlib.contextmanager
    def listen(self, workflow_id: uuid.UUID) -> Iterator[asyncio.Event]:
        """Register for ``workflow_id``'s end: the event is set on each announcement (or sweep
        that finds it ended). Listen before looking (or before starting the run), so no
        announcement falls in between."""
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
        """``finished(woken)``'s first answer that is not ``None`` (it says the workflow
        ended), or ``None`` once ``timeout_s`` has passed. It is asked at once
        (``woken=False``: a caller should look cheaply) and after each wake-up for
        ``workflow_id`` (``woken=True``: most likely over, so a caller can build its answer
        straight away)."""
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
        the first look waits for a wake-up."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        look, was_woken = look_first, False
        while True:
            if look:
                woken.clear()  # before looking: a wake-up during the look is kept
                answer = await finished(was_woken)
                if answer is not None:
                    return answer
            remaining = deadline - loop.time()
            if remaining <= 0:
                return None
            try:
                await asyncio.wait_for(woken.wait(), remaining)
            except TimeoutError:
                return None
            look, was_woken = True, True

    def _wake(self, keys_: Collection[str]) -> None:
        with self._lock:
            waiting = [w for key in keys_ for w in self._waiters.get(key, ())]
        for loop, event in waiting:
            loop.call_soon_threadsafe(event.set)

    def _listen(self) -> None:
        while not self._stop.is_set():
            pubsub = self._client.pubsub(ignore_subscribe_messages=True)
            try:
                pubsub.subscribe(keys.FINISHED)
                while not self._stop.is_set():
                    message = pubsub.get_message(timeout=_RECONNECT_S)
                    if message is not None and message.get("type") == "message":
                        self._wake([str(message["data"])])
            except redis.RedisError as exc:
                log.warning("finish announcements lost (%s); the sweep stands in", exc)
                self._stop.wait(_RECONNECT_S)
            finally:
                pubsub.close()

    def _sweep(self) -> None:
        while not self._stop.wait(SWEEP_S):
            with self._lock:
                awaited = list(self._waiters)
            if not awaited:
                continue
            try:
                ended = self._ended_among([uuid.UUID(key) for key in awaited])
            except Exception as exc:
                log.warning("finish sweep failed (%s); trying again in %g s", exc, SWEEP_S)
                continue
            self._wake([str(workflow_id) for workflow_id in ended])
