"""A reader's side of a channel: ``subscribe`` maps the ring read-only and ``receive`` copies
each message out of it.

Joining: the reader waits until the writer has granted it the ring (a live share; a container
not granted cannot map it), creates its cursor object, shares it live with the writer, rings
the writer's doorbell and waits for its entry in the ring's member table: from then on the
writer never overwrites a message this reader has not read (``BackPressure``).
"""

from __future__ import annotations

import threading
import time
from contextlib import suppress

from cdi.channels import futex
from cdi.channels import ring as r
from cdi.client import CDIObject, Client
from cdi.errors import (
    AccessTimeout,
    CDIError,
    ChannelBroken,
    ChannelClosed,
    ChannelError,
    KeyExists,
    ObjectNotFound,
)

__all__ = ["Subscription", "subscribe"]


LIVENESS_S = 1.0  # how often an idle reader checks that its writer is still there
FIND_S = 0.01  # how often subscribe looks again for a topic that does not exist yet
LEAVE_S = 2.0  # how long close() waits for the writer to let go of the cursor
STOP_S = 0.5  # how often a subscribe given a ``stop`` looks at it


class Subscription:
    """One reader of a topic. Not for concurrent ``receive`` from several threads."""

    def __init__(
        self,
        client: Client,
        name: str,
        timeout: float | None,
        spin_us: int,
        relay: bool = False,
        stop: threading.Event | None = None,
    ) -> None:
        """``relay``: this reader is a gateway carrying the topic to another host; the writer
        counts it as the readers it says it admitted there (``relay_seats``). ``stop``: give
        up waiting (``AccessTimeout``) once it is set."""
        self.client = client
        self.name = name
        self.key = r.ring_key(name)
        self.spin_ns = max(0, spin_us) * 1000
        self.container = str(client.container_id)
        deadline = None if timeout is None else time.monotonic() + timeout
        self._ring = client.use(self.key, check=False)
        self._view = _granted_ring(self._ring, name, deadline, stop)
        self._words = self._view.cast("Q")
        self._address = futex.address_of_view(self._view)
        self._cursor_obj: CDIObject | None = None
        self._closed = False
        try:
            self.geometry = geometry = r.Geometry.read(self._words, len(self._view))
            self._slots, self._slot_bytes = geometry.slots, geometry.slot_bytes
            self._max_message = geometry.max_message
            self._first_word, self._stride_words = r.HEADER_BYTES // 8, geometry.stride // 8
            self._head_address = self._address + 8 * r.HEAD
            if closed := self._words[r.CLOSED]:  # e.g. a mirror whose link broke since our
                raise self._ended(closed)  # grant: we held it, its writer may be gone
            self.writer = str(client.describe(self.key)["owner"])
            cursor = client.create(r.cursor_key(name, self.container), r.CURSOR_BYTES)
            self._cursor = cursor.access()
            self._cursor_words = self._cursor.cast("Q")
            self._cursor_address = futex.address_of_view(self._cursor) + 8 * r.C_CONSUMED
            self._cursor_words[r.C_RELAY] = int(relay)
            self._cursor_words[r.C_MAGIC] = r.CURSOR_MAGIC
            self._cursor_obj = cursor
            cursor.share([self.writer], live=True)
            futex.wake(self._address + 8 * r.DOORBELL)
            start = self._await_entry(deadline, stop)
        except KeyExists as exc:
            self._leave_ring()
            raise ChannelError(
                f"{self.container} already has a subscription to {name!r} (close it first)"
            ) from exc
        except BaseException:
            self.close(linger=0)
            raise
        self._cursor_words[r.C_CONSUMED] = start
        self._next = start + 1
        self._next_check = time.monotonic() + LIVENESS_S

    # ------------------------------------------------------------- the public API
    def receive(self, timeout: float | None = None) -> bytes:
        """The next message, waiting for it up to ``timeout`` seconds (``None``: no limit;
        ``TimeoutError``, as ``AccessTimeout``, after that). Sleeps on a futex, after polling
        for ``spin_us`` if the subscription was opened with one. ``ChannelClosed`` once the
        writer has closed the topic and every message is read, or the writer is gone."""
        if self._closed:
            raise ChannelClosed(f"this subscription to {self.name!r} is closed")
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            length, total, flags, data = self._chunk(deadline)
            if flags & r.FIRST:
                break  # a chunk without its start: the tail of a message cut short, or one
                # that began before we joined
        if flags & r.LAST:
            return data
        parts, got = [data], length
        while True:
            length, part_total, flags, data = self._chunk(deadline)
            if flags & r.FIRST:  # the writer gave up on the message we were reading
                parts, got, total = [data], length, part_total
            else:
                parts.append(data)
                got += length
            if flags & r.LAST:
                if got != total:
                    raise ChannelError(f"{self.name!r}: a message of {total} bytes lost chunks")
                return b"".join(parts)

    def available(self) -> bool:
        """Whether a message (or its first part) is waiting: ``receive`` would not sleep."""
        return not self._closed and self._words[r.HEAD] >= self._next

    def relay_seats(self, seats: int) -> None:
        """A relay's count of the readers it admitted on its host (see ``relay``)."""
        if not self._closed:
            self._cursor_words[r.C_SEATS] = max(0, seats)

    def close(self, linger: float = LEAVE_S) -> None:
        """Leave the topic: tell the writer, wait up to ``linger`` seconds for it to let go of
        our cursor, free the cursor and give up the ring."""
        if self._closed:
            return
        self._closed = True
        if self._cursor_obj is not None:
            if self._cursor_obj.owned:
                self._cursor_words[r.C_CLOSED] = 1
                futex.wake(self._cursor_address)
                futex.wake(self._address + 8 * r.DOORBELL)
                self._cursor_words.release()
                self._cursor.release()
            r.destroy_once_alone(self._cursor_obj, linger)
        self._leave_ring()

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Subscription:
        return self

    def __next__(self) -> bytes:
        try:
            return self.receive()
        except ChannelClosed:
            raise StopIteration from None

    # ------------------------------------------------------------- internals
    def _chunk(self, deadline: float | None) -> tuple[int, int, int, bytes]:
        """The next slot's chunk: its length, its message's length, its flags and its bytes."""
        seq = self._next
        words = self._words
        if words[r.HEAD] < seq:
            self._await(seq, deadline)
        base = self._first_word + (seq - 1) % self._slots * self._stride_words
        if words[base] != seq:  # r.SEQ
            raise self._overrun(seq)
        total, length, flags = words[base + r.TOTAL], words[base + r.LENGTH], words[base + r.FLAGS]
        if length > self._slot_bytes or total > self._max_message:
            raise self._overrun(seq)
        start = base * 8 + r.SLOT_HEADER_BYTES
        data = bytes(self._view[start : start + length])
        if words[base] != seq:
            raise self._overrun(seq)
        self._next = seq + 1
        self._cursor_words[r.C_CONSUMED] = seq
        r.fence()  # our store of consumed before our load of the writer's flag (ring)
        if words[r.WAITING]:
            futex.wake(self._cursor_address)
        return length, total, flags, data

    def _await(self, seq: int, deadline: float | None) -> None:
        """Until the writer has written sequence ``seq``."""
        words = self._words
        if self.spin_ns:
            clock = time.perf_counter_ns
            stop = clock() + self.spin_ns
            while clock() < stop:
                if words[r.HEAD] >= seq:
                    return
        cursor = self._cursor_words
        try:
            while True:
                cursor[r.C_SLEEPING] = 1  # before we look: the writer wakes us if it writes
                head = words[r.HEAD]
                if head >= seq:
                    return
                if closed := words[r.CLOSED]:
                    self.close(linger=0)
                    raise self._ended(closed)
                now = time.monotonic()
                if now >= self._next_check:
                    self._check_writer()
                    self._next_check = now + LIVENESS_S
                wait = self._next_check - now
                if deadline is not None:
                    if now >= deadline:
                        raise AccessTimeout(f"no message on {self.name!r} within the timeout")
                    wait = min(wait, deadline - now)
                futex.wait(self._head_address, head & 0xFFFFFFFF, wait)
        finally:
            if not self._closed:
                cursor[r.C_SLEEPING] = 0

    def _check_writer(self) -> None:
        """``ChannelClosed`` if the writer no longer holds our cursor (it died, or dropped us).
        A writer that closed the ring let go of our cursor after writing why (``Topic.close``):
        if it did so since we last looked at the ring, that reason is the error (a gateway
        whose link broke says ``ChannelBroken``)."""
        key = r.cursor_key(self.name, self.container)
        listed = self.client.list_objects(key)
        if not listed or self.writer not in listed[0]["readers"]:
            closed = self._words[r.CLOSED]
            self.close(linger=0)
            if closed:
                raise self._ended(closed)
            raise ChannelClosed(f"the writer of {self.name!r} ({self.writer}) is gone")

    def _ended(self, closed: int) -> ChannelError:
        """What the ring's ``closed`` word says: the writer closed it, or its link broke."""
        if closed == r.CLOSED_BROKEN:
            return ChannelBroken(
                f"the link that carried {self.name!r} from another host broke; "
                "messages not received before it are lost"
            )
        return ChannelClosed(f"the writer closed {self.name!r}")

    def _overrun(self, seq: int) -> ChannelError:
        return ChannelError(
            f"{self.name!r}: message {seq} was overwritten before {self.container} read it "
            "(the writer no longer counts this reader: it closed the topic or dropped us)"
        )

    def _await_entry(self, deadline: float | None, stop: threading.Event | None) -> int:
        """The sequence after which the writer owes us every message, once it admitted us."""
        tag = r.reader_tag(self.container)
        words = self._words
        epoch_address = self._address + 8 * r.EPOCH
        while True:
            epoch = words[r.EPOCH]
            for index in range(r.MAX_MEMBERS):
                entry = r.MEMBERS + 2 * index
                if words[entry] == tag:
                    return int(words[entry + 1])
            if closed := words[r.CLOSED]:
                raise self._ended(closed)
            wait = STOP_S if deadline is None else min(STOP_S, deadline - time.monotonic())
            if wait <= 0 or (stop is not None and stop.is_set()):
                raise AccessTimeout(
                    f"the writer of {self.name!r} ({self.writer}) did not admit "
                    f"{self.container} within the timeout" + (" (stopped)" if wait > 0 else "")
                )
            futex.wait(epoch_address, epoch & 0xFFFFFFFF, wait)

    def _leave_ring(self) -> None:
        self._words.release()
        self._view.release()
        with suppress(CDIError):
            self._ring.release()


def _granted_ring(
    ring: CDIObject, name: str, deadline: float | None, stop: threading.Event | None
) -> memoryview:
    """Our read-only view of the ring, once the topic exists and its writer granted it us."""
    while True:
        if stop is not None and stop.is_set():
            raise AccessTimeout(f"stopped waiting for the writer of {name!r} to grant the topic")
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        step = remaining  # with a ``stop``, waited in slices to look at it in between
        if stop is not None:
            step = STOP_S if remaining is None else min(STOP_S, remaining)
        try:
            return ring.read(timeout=step)
        except ObjectNotFound:
            if remaining is not None and remaining <= 0:
                raise
            time.sleep(FIND_S if remaining is None else min(FIND_S, remaining))
        except AccessTimeout as exc:
            if step != remaining:
                continue  # a slice ended, not the wait
            raise AccessTimeout(
                f"the writer of {name!r} did not grant this container the topic within the timeout"
            ) from exc


def subscribe(
    client: Client,
    name: str,
    *,
    timeout: float | None = None,
    spin_us: int = 0,
    stop: threading.Event | None = None,
) -> Subscription:
    """Join topic ``name`` as a reader: it receives every message published after it joined.
    Waits up to ``timeout`` seconds for the topic to exist, its writer to grant this container
    and admit it (``AccessTimeout`` after that, or as soon as ``stop`` is set: a caller that
    must notice being stopped passes it rather than retrying short timeouts, since each retry
    leaves and joins anew, and a writer that counted the reader that left may close before it
    admits the next). ``spin_us``: how long ``receive`` polls the ring before it sleeps (0, the
    default: it sleeps at once; a spin trades a CPU for latency)."""
    r.registered(client)
    return Subscription(client, name, timeout, spin_us, stop=stop)
