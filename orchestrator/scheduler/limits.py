"""A task's concurrency limit over every scheduler: leases in Redis.

A task with ``max_concurrency`` N has a sorted set (``keys.task_leases_key``) of at most N
leases, one per step run out at a worker, each scored with the moment it lapses. A scheduler
takes a lease before it sends such a step (``acquire``: one Lua script, so two schedulers can
never both take the last place), gives it back when the step comes back, is withdrawn or is
lost (``release``), and renews the leases of every step it has out once a tick (``renew``).
A scheduler that dies renews nothing: its leases lapse after ``LEASE_S`` and their places come
back, while the scheduler that takes its runs over takes new leases for them. A Redis that
lost its data has the leases back at the next tick's renewal.

*Why Redis, not Postgres:* the lease is taken on the path of every step of such a task, before
its instruction goes out; one script call is one round trip, a Postgres transaction with a
lock four. *What it does not do:* a step a dead scheduler had out may still be running on its
worker when its lease lapses (a task longer than ``LEASE_S``), and between a Redis flush and
the next renewal another scheduler may take a place that was held.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable
from typing import Final

import redis

from orchestrator.contract import keys

__all__ = ["LEASE_S", "TaskLimits"]

log = logging.getLogger(__name__)

LEASE_S: Final = 30.0  # a lease not renewed for this long lapses

# KEYS[1]: the task's leases; ARGV: the limit, the lease's member, its lifetime (s). Drops
# lapsed leases, then holds the member's lease (renewed) if it has one or a place is free.
_ACQUIRE: Final = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZSCORE', KEYS[1], ARGV[2]) or
   redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[1]) then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[2])
  redis.call('EXPIRE', KEYS[1], math.ceil(tonumber(ARGV[3])) * 2)
  return 1
end
return 0
"""

# KEYS: tasks' leases; ARGV[1]: lifetime (s), then per key a count and that many members.
_RENEW: Final = """
local t = redis.call('TIME')
local until_ = tonumber(t[1]) + tonumber(t[2]) / 1000000 + tonumber(ARGV[1])
local i = 2
for k = 1, #KEYS do
  local n = tonumber(ARGV[i])
  for m = 1, n do
    redis.call('ZADD', KEYS[k], until_, ARGV[i + m])
  end
  redis.call('EXPIRE', KEYS[k], math.ceil(tonumber(ARGV[1])) * 2)
  i = i + n + 1
end
return 1
"""


class TaskLimits:
    """One scheduler's side of the tasks' concurrency limits (its loop thread alone uses it)."""

    def __init__(self, client: redis.Redis, lease_s: float = LEASE_S) -> None:
        self._redis = client
        self.lease_s = lease_s
        self._acquire = client.register_script(_ACQUIRE)
        self._renew = client.register_script(_RENEW)

    def acquire(self, task: str, limit: int, member: str) -> bool:
        """Take (or renew) ``member``'s lease on a place of ``task``; False when all ``limit``
        places are held by others (the step waits)."""
        key = keys.task_leases_key(task)
        return bool(self._acquire(keys=[key], args=[limit, member, self.lease_s]))

    def release(self, task: str, member: str) -> None:
        """Give a place back (a Redis error leaves it to lapse)."""
        try:
            self._redis.zrem(keys.task_leases_key(task), member)
        except redis.RedisError as exc:
            log.warning("could not give back the lease %s of task %s: %s", member, task, exc)

    def renew(self, held: Iterable[tuple[str, str]]) -> None:
        """Renew every (task, member) lease this scheduler holds, in one call."""
        by_task: dict[str, list[str]] = defaultdict(list)
        for task, member in held:
            by_task[task].append(member)
        if not by_task:
            return
        args: list[str | float] = [self.lease_s]
        for members in by_task.values():
            args += [len(members), *members]
        self._renew(keys=[keys.task_leases_key(t) for t in by_task], args=args)
