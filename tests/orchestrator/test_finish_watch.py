"""FinishWatch against a real Redis: announcements wake their waiters, and a subscription that
was lost wakes every waiter once it is back (what was published meanwhile went unheard)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable

import redis

from orchestrator import keys
from orchestrator.controller.finish_watch import FinishWatch


def _subscribed(client: redis.Redis) -> bool:
    counts = dict(client.pubsub_numsub(keys.FINISHED))
    return int(counts.get(keys.FINISHED, 0)) > 0


def _wait_for(check: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_an_announcement_wakes_only_its_waiters(api_redis: redis.Redis) -> None:
    watch = FinishWatch(api_redis)
    watch.start()
    try:
        _wait_for(lambda: _subscribed(api_redis), "the subscription")
        mine, other = uuid.uuid4(), uuid.uuid4()

        async def scenario() -> tuple[bool, bool]:
            with watch.listen(mine) as woken, watch.listen(other) as not_woken:
                api_redis.publish(keys.FINISHED, str(mine))
                await asyncio.wait_for(woken.wait(), 5)
                await asyncio.sleep(0.1)
                return woken.is_set(), not_woken.is_set()

        assert asyncio.run(scenario()) == (True, False)
    finally:
        watch.close()


def test_a_lost_subscription_wakes_every_waiter_when_it_is_back(api_redis: redis.Redis) -> None:
    watch = FinishWatch(api_redis)
    watch.start()
    try:
        _wait_for(lambda: _subscribed(api_redis), "the subscription")

        async def scenario() -> bool:
            with watch.listen(uuid.uuid4()) as woken:
                # Drop the listener's connection, as a Redis restart or a network cut would.
                api_redis.client_kill_filter(_type="pubsub")
                await asyncio.wait_for(woken.wait(), 10)
                return woken.is_set()

        assert asyncio.run(scenario())
    finally:
        watch.close()
