"""A worker's reports and acknowledgements, several in one Redis script call when they end
together.

A slot or finisher thread that ends an instruction hands its report to ``Replies.deliver``,
which returns once Redis has it. The first to come sends at once; those that come while that
call is out wait and go together in the next one, up to ``BATCH`` (one round trip, one script
run, however many). For each report the script LPUSHes it onto its ``reply_to`` list, rings
that list's bell (``keys.report_bell_key``) and only then LREMs the instruction from the
worker's in-flight list, all atomic on the server: a report is never sent without its
acknowledgement, nor the reverse. A report list Redis refuses (WRONGTYPE) costs that report
only: it is dropped and its instruction acknowledged, the others go on. *Why a script, not
MULTI/EXEC:* one command instead of four a report, and redis-py's pipeline machinery was a
sixth of a worker's CPU at 10 KB (py-spy).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import redis

from orchestrator.contract import keys

__all__ = ["BATCH", "Replies"]

log = logging.getLogger(__name__)

BATCH: Final = 32  # reports a script call carries at most
_ATTEMPTS_WHEN_STOPPING: Final = 3

# KEYS: the in-flight list, then each report's list and its bell; ARGV: each instruction as
# popped and its report. Answers the reports whose list refused them: their positions
# (1-based) and Redis's errors, in turn.
_REPORT_AND_ACK = """
local refused = {}
for i = 1, #ARGV / 2 do
  local pushed = redis.pcall('LPUSH', KEYS[2 * i], ARGV[2 * i])
  if type(pushed) == 'table' and pushed.err then
    refused[#refused + 1] = i
    refused[#refused + 1] = pushed.err
  else
    redis.call('LPUSH', KEYS[2 * i + 1], '1')
  end
  redis.call('LREM', KEYS[1], 1, ARGV[2 * i - 1])
end
return refused
"""


@dataclass(eq=False)
class _Reply:
    raw: bytes  # the instruction as popped
    reply_to: str
    report: bytes
    done: bool = False


class Replies:
    """Delivers a worker's reports, each with its instruction's acknowledgement. ``client``:
    the calling thread's Redis client; ``stopping``: once True, a delivery Redis cannot take
    gives up after a few tries, leaving its instruction in flight for the scheduler."""

    def __init__(
        self,
        redis_client: redis.Redis,
        inflight_key: str,
        client: Callable[[], redis.Redis],
        stopping: Callable[[], bool],
    ) -> None:
        self.inflight_key = inflight_key
        self._client = client
        self._stopping = stopping
        self._script = redis_client.register_script(_REPORT_AND_ACK)
        self._changed = threading.Condition()
        self._waiting: list[_Reply] = []
        self._sending = False

    def load(self) -> None:
        """Load the script into Redis now, so that its first call needs no second try (Redis
        answers NOSCRIPT to a script it has not seen, and redis-py then sends it)."""
        self._script.registered_client.script_load(self._script.script)

    def deliver(self, raw: bytes, reply_to: str, report: bytes) -> None:
        """Send ``report`` to ``reply_to`` and acknowledge ``raw``, with whatever other reports
        come meanwhile; return once Redis has it (or it was given up)."""
        mine = _Reply(raw, reply_to, report)
        with self._changed:
            self._waiting.append(mine)
            while self._sending and not mine.done:
                self._changed.wait()
            if mine.done:
                return
            self._sending = True
            batch, self._waiting = self._waiting[:BATCH], self._waiting[BATCH:]
        try:
            self._send(batch)
        finally:
            with self._changed:
                for reply in batch:
                    reply.done = True
                self._sending = False  # one still waiting sends the next batch
                self._changed.notify_all()

    @property
    def sending(self) -> bool:
        """Whether a call is out."""
        with self._changed:
            return self._sending

    def waiting(self) -> int:
        """Reports waiting for the call out to return."""
        with self._changed:
            return len(self._waiting)

    def _send(self, batch: list[_Reply]) -> None:
        """One script call for ``batch``; retried while Redis is unreachable."""
        lists = [self.inflight_key]
        args: list[bytes] = []
        for reply in batch:
            lists += [reply.reply_to, keys.report_bell_key(reply.reply_to)]
            args += [reply.raw, reply.report]
        attempt = 0
        while True:
            attempt += 1
            try:
                refused = self._script(keys=lists, args=args, client=self._client())
                break
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                if self._stopping() and attempt >= _ATTEMPTS_WHEN_STOPPING:
                    log.error("giving up on delivering %d report(s) (left in flight): %s",
                              len(batch), exc)  # fmt: skip
                    return
                log.warning("cannot deliver %d report(s) (attempt %d): %s; retrying",
                            len(batch), attempt, exc)  # fmt: skip
                time.sleep(min(5.0, 0.5 * attempt))
            except redis.RedisError as exc:  # retrying cannot help
                log.error("Redis refused %d report(s): %s; dropping them", len(batch), exc)
                self._ack(batch)
                return
        for at, error in zip(refused[::2], refused[1::2], strict=True):
            # E.g. WRONGTYPE: reply_to is not a list. Retrying cannot help.
            log.error("Redis refused the report for %r: %s; dropping it",
                      batch[int(at) - 1].reply_to, _text(error))  # fmt: skip

    def _ack(self, batch: list[_Reply]) -> None:
        try:
            pipe = self._client().pipeline(transaction=False)
            for reply in batch:
                pipe.lrem(self.inflight_key, 1, reply.raw)  # type: ignore[arg-type]
            pipe.execute()
        except redis.RedisError as exc:
            log.error("cannot remove instructions from %s: %s", self.inflight_key, exc)


def _text(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value
