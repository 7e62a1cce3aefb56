"""A streaming step's channels (``workflows.streaming``), as this worker opens them.

Before the task function starts, ``StreamHub.open`` joins the step to its peers (the steps of
its run joined to it by channels, which the scheduler starts together):

1. it writes which CDI container runs each of its ends in the run's Redis hash
   (``keys.stream_peers_key``);
2. for each channel it publishes, it waits until every subscriber has written its entry, then
   opens the topic (a CDI ring, ``cdi.channels``) for the subscribers in other containers
   and an in-memory queue for each one in this process (a container cannot read its own
   ring through the minion, and need not);
3. for each channel it subscribes to, it waits for the publisher's entry and subscribes to
   its ring, or takes its queue when the publisher runs in this process;
4. it waits until every subscriber in another container has joined its rings.

No step waits on another's progress but for these entries and joins, which every peer makes
before it waits, so the order in which a task then publishes and subscribes does not matter.
The topics are named after the run (``run-<id>-<channel>``): runs never see each other's items.

Every wait looks at ``ctx.cancelled`` (the run cancelled or timed out, the task past its
``timeout_s``) and gives up after ``PEER_WAIT_S`` for a peer that never came (a streaming
group needs a free worker slot per step). When the task ends, ``close`` ends each published
stream: with its end marker when the task returned, broken when it failed or was stopped (its
subscribers then fail with ``StreamBroken``, and the run with them).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import suppress
from typing import Any, Final, TypeVar

import redis

import cdi
from cdi import channels as cdi_channels
from orchestrator.contract import keys
from orchestrator.contract.messages import Instruction
from workflows.errors import InvalidData
from workflows.streaming import BROKEN, END, StreamBroken, decode_item, encode_item

__all__ = ["PEER_WAIT_S", "RunChannels", "StreamHub", "topic_name"]

log = logging.getLogger(__name__)

PEER_WAIT_S: Final = 60.0  # how long a streaming step waits for its peers to join
_POLL_S: Final = 0.01
_LIVENESS_S: Final = 0.5  # how often a blocked send or receive looks at ``cancelled``
LOCAL_ITEMS: Final = 16  # items a subscriber in this process may be behind its publisher
RING_SLOTS: Final = 32
RING_SLOT_BYTES: Final = 256 << 10

T = TypeVar("T")


def topic_name(workflow_id: str, channel: str) -> str:
    """The CDI topic of ``channel`` in run ``workflow_id`` (a sub-workflow's channels are
    named ``<step>/<channel>``; a topic's name holds no '/')."""
    return f"run-{workflow_id}-{channel.replace('/', '~')}"


class StreamHub:
    """This worker process's side of every streaming step it runs."""

    def __init__(
        self, client: cdi.Client, redis_client: redis.Redis, peer_wait_s: float = PEER_WAIT_S
    ) -> None:
        self.client = client
        self.redis = redis_client
        self.peer_wait_s = peer_wait_s
        self._local: dict[tuple[str, str, str], queue.Queue[bytes]] = {}
        self._lock = threading.Lock()

    @property
    def container(self) -> str:
        return str(self.client.container_id)

    def local_queue(self, workflow_id: str, channel: str, subscriber: str) -> queue.Queue[bytes]:
        """The queue from a publisher to a subscriber that both run in this process (made by
        whichever end comes first)."""
        with self._lock:
            return self._local.setdefault(
                (workflow_id, channel, subscriber), queue.Queue(LOCAL_ITEMS)
            )

    def forget(self, workflow_id: str, channel: str, subscriber: str) -> None:
        with self._lock:
            self._local.pop((workflow_id, channel, subscriber), None)

    def open(self, ins: Instruction, cancelled: threading.Event) -> RunChannels | None:
        """The channels of ``ins``, joined to its peers (None: not a streaming step)."""
        plan = ins.channels if isinstance(ins.channels, dict) else {}
        if not plan:
            return None
        run = RunChannels(self, ins, plan, cancelled)
        try:
            run.join()
        except BaseException:
            run.close(failed=True)
            raise
        return run


class _Sender:
    """The publisher's end of one channel: a CDI topic and/or queues in this process."""

    def __init__(
        self,
        name: str,
        topic: cdi_channels.Topic | None,
        local: list[queue.Queue[bytes]],
        cancelled: threading.Event,
    ) -> None:
        self.name = name
        self.topic = topic
        self.local = local
        self.cancelled = cancelled
        self.closed = False
        self.items = 0

    def send(self, item: Any) -> None:
        if self.closed:
            raise InvalidData(f"channel {self.name!r} is closed: its stream has ended")
        self._deliver(b"".join(encode_item(item)))
        self.items += 1

    def _deliver(self, message: bytes, *, stopping: bool = False) -> None:
        if self.topic is not None:
            while True:
                try:
                    self.topic.publish(message, timeout=_LIVENESS_S)
                    break
                except cdi.ChannelFull:
                    if self.cancelled.is_set() and not stopping:
                        raise StreamBroken(f"channel {self.name!r}: the task was stopped") from None
                    if stopping:
                        return  # a reader that stopped reading: it is failing anyway
        for q in self.local:
            _put(q, message, self.cancelled, self.name, stopping=stopping)

    def close(self, *, broken: bool = False) -> None:
        """End the stream (``broken``: the task failed or was stopped)."""
        if self.closed:
            return
        self.closed = True
        with suppress(Exception):
            self._deliver(BROKEN if broken else END, stopping=True)
        if self.topic is not None:
            with suppress(Exception):
                self.topic.close(broken=broken)


def _put(
    q: queue.Queue[bytes], message: bytes, cancelled: threading.Event, name: str, *, stopping: bool
) -> None:
    while True:
        try:
            q.put(message, timeout=_LIVENESS_S)
            return
        except queue.Full:
            if stopping:
                return
            if cancelled.is_set():
                raise StreamBroken(f"channel {name!r}: the task was stopped") from None


def _publisher_broke(name: str, publisher: str, how: str) -> str:
    """What a subscriber of ``name`` is told when its publisher ended it other than by its end
    marker."""
    return f"channel {name!r}: its publisher, step {publisher!r}, {how} before it ended its stream"


class _Receiver:
    """A subscriber's end of one channel: a CDI subscription or a queue in this process."""

    def __init__(
        self,
        name: str,
        publisher: str,
        subscription: cdi_channels.Subscription | None,
        local: queue.Queue[bytes] | None,
        cancelled: threading.Event,
    ) -> None:
        self.name = name
        self.publisher = publisher
        self.subscription = subscription
        self.local = local
        self.cancelled = cancelled
        self.ended = False

    def __iter__(self) -> Iterator[Any]:
        while not self.ended:
            message = self._next()
            if message == END:
                self.ended = True
                return
            if message == BROKEN:
                self.ended = True
                raise StreamBroken(self.broken("failed or was stopped"))
            yield decode_item(message)

    def broken(self, how: str) -> str:
        return _publisher_broke(self.name, self.publisher, how)

    def _next(self) -> bytes:
        while True:
            if self.cancelled.is_set():
                raise StreamBroken(f"channel {self.name!r}: the task was stopped")
            if self.local is not None:
                with suppress(queue.Empty):
                    return self.local.get(timeout=_LIVENESS_S)
                continue
            assert self.subscription is not None
            try:
                return self.subscription.receive(timeout=_LIVENESS_S)
            except TimeoutError:
                continue
            except cdi.ChannelError as exc:  # closed or broken without our end marker
                self.ended = True
                raise StreamBroken(self.broken(f"went away ({exc})")) from None

    def close(self) -> None:
        if self.subscription is not None:
            with suppress(Exception):
                self.subscription.close()


class RunChannels:
    """One streaming step's channels (``workflows.streaming.Channels``)."""

    def __init__(
        self, hub: StreamHub, ins: Instruction, plan: dict[str, Any], cancelled: threading.Event
    ) -> None:
        self.hub = hub
        self.ins = ins
        self.workflow_id = str(ins.workflow_id)
        self.ref = str(ins.ref)
        self.publishes: dict[str, list[str]] = dict(plan.get("publish") or {})
        self.subscribes: dict[str, str] = dict(plan.get("subscribe") or {})
        self.cancelled = cancelled
        self.key = keys.stream_peers_key(self.workflow_id)
        self.senders: dict[str, _Sender] = {}
        self.receivers: dict[str, _Receiver] = {}
        self._deadline = time.monotonic() + hub.peer_wait_s

    # ------------------------------------------------------------- the task's API
    def publish(self, name: str) -> _Sender:
        sender = self.senders.get(name)
        if sender is None:
            raise InvalidData(self._not_declared(name, "publish"))
        return sender

    def subscribe(self, name: str) -> _Receiver:
        receiver = self.receivers.get(name)
        if receiver is None:
            raise InvalidData(self._not_declared(name, "subscribe"))
        return receiver

    def _not_declared(self, name: str, role: str) -> str:
        listed = sorted(self.senders if role == "publish" else self.receivers)
        return (
            f"step {self.ref!r} does not {role} channel {name!r} (its 'channels.{role}': "
            f"{', '.join(listed) or 'none'})"
        )

    # ------------------------------------------------------------- joining, leaving
    def join(self) -> None:
        """Steps 1 to 4 of the module's docstring."""
        me = self.hub.container
        entries = {f"{name}.pub": me for name in self.publishes}
        entries |= {f"{name}.sub.{self.ref}": me for name in self.subscribes}
        pipe = self.hub.redis.pipeline()
        pipe.hset(self.key, mapping=entries)  # type: ignore[arg-type]
        pipe.expire(self.key, keys.STREAM_PEERS_TTL_S)
        pipe.execute()
        remote: dict[str, int] = {}
        for name, subscribers in self.publishes.items():
            fields = [f"{name}.sub.{ref}" for ref in subscribers]
            where = self._await_entries(fields, f"the subscribers of {name!r}")
            others = [c for c in where.values() if c != me]
            local = [
                self.hub.local_queue(self.workflow_id, name, ref)
                for ref, c in zip(subscribers, where.values(), strict=True)
                if c == me
            ]
            topic = None
            if others:
                topic = cdi_channels.open_topic(
                    self.hub.client, topic_name(self.workflow_id, name), readers=others,
                    slots=RING_SLOTS, slot_bytes=RING_SLOT_BYTES,
                )  # fmt: skip
                remote[name] = len(others)
            self.senders[name] = _Sender(name, topic, local, self.cancelled)
        for name, publisher in self.subscribes.items():
            where = self._await_entries([f"{name}.pub"], f"the publisher of {name!r}")
            if next(iter(where.values())) == me:
                self.receivers[name] = _Receiver(
                    name, publisher, None,
                    self.hub.local_queue(self.workflow_id, name, self.ref), self.cancelled,
                )  # fmt: skip
                continue
            # One subscription for the whole wait, stopped with the task: one retried in short
            # timeouts would leave and join anew, and the publisher, which counted the one that
            # left, could end its stream before it admitted the next.
            try:
                subscription = self._waiting(
                    lambda n=name: cdi_channels.subscribe(  # type: ignore[misc]
                        self.hub.client, topic_name(self.workflow_id, n),
                        timeout=max(0.0, self._deadline - time.monotonic()), stop=self.cancelled,
                    ),
                    f"the publisher of {name!r} (step {publisher!r}) to open it",
                )  # fmt: skip
            except cdi.ChannelError as exc:  # it ended (failed, or its link broke) before us
                how = f"went away ({exc})"
                raise StreamBroken(_publisher_broke(name, publisher, how)) from None
            self.receivers[name] = _Receiver(name, publisher, subscription, None, self.cancelled)
        for name, count in remote.items():
            topic = self.senders[name].topic
            assert topic is not None
            self._waiting(
                lambda t=topic, c=count: t.wait_for_readers(c, timeout=_LIVENESS_S),  # type: ignore[misc]
                f"{count} subscriber(s) of {name!r} to join",
            )

    def _await_entries(self, fields: list[str], what: str) -> dict[str, str]:
        def read() -> dict[str, str]:
            values = self.hub.redis.hmget(self.key, fields)
            if any(v is None for v in values):
                raise TimeoutError(what)
            return {
                f: v.decode() if isinstance(v, bytes) else str(v)
                for f, v in zip(fields, values, strict=True)
            }

        return self._waiting(read, what, pause=_POLL_S)

    def _waiting(self, attempt: Callable[[], T], what: str, pause: float = 0.0) -> T:
        """``attempt()`` again while it times out, until the task is stopped or the peers'
        wait is over."""
        while True:
            if self.cancelled.is_set():
                raise StreamBroken(f"step {self.ref!r} was stopped while waiting for {what}")
            try:
                return attempt()
            except (TimeoutError, cdi.AccessTimeout):
                pass
            if time.monotonic() >= self._deadline:
                raise StreamBroken(
                    f"step {self.ref!r} waited {self.hub.peer_wait_s:g} s for {what}; the steps "
                    "of a streaming group run at the same time, each on a free worker slot"
                )
            if pause:
                time.sleep(pause)

    def close(self, *, failed: bool) -> None:
        """End every stream this step publishes (broken when ``failed``) and leave the ones it
        subscribes to."""
        for sender in self.senders.values():
            sender.close(broken=failed)
        for name, receiver in self.receivers.items():
            receiver.close()
            if receiver.local is not None:
                self.hub.forget(self.workflow_id, name, self.ref)
        if failed:  # a subscriber here that never came would wait on its queue for good
            for name, subscribers in self.publishes.items():
                for ref in subscribers:
                    self.hub.forget(self.workflow_id, name, ref)
