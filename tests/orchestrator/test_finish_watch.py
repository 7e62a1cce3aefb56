"""FinishWatch against a real Redis: announcements wake their waiters only, a subscription that
was lost is made again, and the sweep wakes a waiter whose run ended unannounced."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable, Collection

import redis

from orchestrator.contract import keys
from orchestrator.controller.finish_watch import SWEEP_S, FinishWatch


def _subscribed(client: redis.Redis) -> bool:
    counts = dict(client.pubsub_numsub(keys.FINISHED))
    return int(counts.get(keys.FINISHED, 0)) > 0


def _wait_for(check: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _none_ended(ids: Collection[uuid.UUID]) -> set[uuid.UUID]:
    return set()


def test_an_announcement_wakes_only_its_waiters(api_redis: redis.Redis) -> None:
    watch = FinishWatch(api_redis, _none_ended)
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


def test_a_lost_subscription_is_made_again(api_redis: redis.Redis) -> None:
    watch = FinishWatch(api_redis, _none_ended)
    watch.start()
    try:
        _wait_for(lambda: _subscribed(api_redis), "the subscription")
        # Drop the listener's connection, as a Redis restart or a network cut would.
        api_redis.client_kill_filter(_type="pubsub")
        mine = uuid.uuid4()

        async def scenario() -> bool:
            # What is published while the listener reconnects is lost (the sweep covers
            # that): announce until heard, which only a new subscription can do.
            with watch.listen(mine) as woken:
                for _ in range(50):
                    api_redis.publish(keys.FINISHED, str(mine))
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(woken.wait(), 0.2)
                    if woken.is_set():
                        break
                return woken.is_set()

        assert asyncio.run(scenario())
    finally:
        watch.close()


def test_the_sweep_wakes_waiters_of_runs_ended_unannounced(api_redis: redis.Redis) -> None:
    ended, asked = uuid.uuid4(), []
    still_running = uuid.uuid4()

    def ended_among(ids: Collection[uuid.UUID]) -> set[uuid.UUID]:
        asked.append(set(ids))
        return {ended} & set(ids)

    watch = FinishWatch(api_redis, ended_among)
    watch.start()
    try:

        async def scenario() -> tuple[bool, bool]:
            with watch.listen(ended) as woken, watch.listen(still_running) as not_woken:
                await asyncio.wait_for(woken.wait(), 10 * SWEEP_S)
                return woken.is_set(), not_woken.is_set()

        assert asyncio.run(scenario()) == (True, False)
        assert {ended, still_running} in asked  # one question for every waiter
    finally:
        watch.close()
