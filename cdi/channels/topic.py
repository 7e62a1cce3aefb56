"""The writer's side of a channel: ``Topic.publish`` into a ring its readers map read-only.

The writer owns the ring (a CDI object) and shares it *live* with the containers it grants.
Each reader that subscribes creates a one-page cursor object of its own and shares it live with
the writer: the writer reads there how far the reader has got, and only that reader can write
it. A housekeeping thread admits readers as they join (it maps their cursor and writes their
entry in the ring's member table) and lets go of those that leave or die.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Iterable
from contextlib import suppress
from dataclasses import dataclass

from cdi import protocol
from cdi.channels import futex
from cdi.channels import ring as r
from cdi.client import CDIObject, Client
from cdi.errors import (
    CDIError,
    ChannelFull,
    InvalidArgument,
    NotOwner,
    ObjectNotFound,
)

__all__ = ["BackPressure", "Topic", "open_topic"]

log = logging.getLogger(__name__)

DEFAULT_SLOTS = 64
DEFAULT_SLOT_BYTES = 64 << 10
DEFAULT_MAX_MESSAGE = 64 << 20
LIVENESS_S = 0.5  # how often a held-back writer, and the housekeeper, check for dead readers
LINGER_S = 2.0  # how long close() waits for the readers to let go of the ring


class BackPressure(enum.StrEnum):
    """What ``publish`` does when a reader has not read the message it would overwrite."""

    BLOCK = "block"
    """Wait for the reader (up to the call's ``timeout``; ``ChannelFull`` after that)."""
    FAIL = "fail"
    """Raise ``ChannelFull`` at once; nothing of the message is written."""


@dataclass(eq=False)
class _Member:
    """A reader the writer has admitted: its cursor, mapped read-only."""

    container: str
    cursor: CDIObject
    view: memoryview
    words: memoryview
    consumed_address: int
    index: int
    start: int  # the reader is owed every sequence after this one

    def consumed(self) -> int:
        return max(self.words[r.C_CONSUMED], self.start)

    def closed(self) -> bool:
        return bool(self.words[r.C_CLOSED])

    def unmap(self) -> None:
        self.words.release()
        self.view.release()


class Topic:
    """A channel's one writer. Not for concurrent ``publish`` from several threads."""

    def __init__(
        self,
        client: Client,
        name: str,
        geometry: r.Geometry,
        policy: BackPressure,
    ) -> None:
        self.client = client
        self.name = name
        self.key = r.ring_key(name)
        self.geometry = geometry
        self.policy = BackPressure(policy)
        self._obj = client.create(self.key, geometry.size)
        self._view = self._obj.access()
        self._words = self._view.cast("Q")
        self._address = futex.address_of_view(self._view)
        words = self._words
        words[r.SLOTS], words[r.SLOT_BYTES] = geometry.slots, geometry.slot_bytes
        words[r.MAX_MESSAGE] = geometry.max_message
        words[r.MAGIC] = r.RING_MAGIC
        self._head = 0
        self._floor = 0  # every admitted reader has consumed at least this sequence
        self._granted: set[str] = set()
        self._members: dict[str, _Member] = {}
        self._lock = threading.Lock()  # the member table and the client's calls for it
        self._closed = False
        self._stop = False
        self._housekeeper = threading.Thread(
            target=self._housekeep_forever, name=f"channel-{name}", daemon=True
        )
        self._housekeeper.start()

    # ------------------------------------------------------------- the public API
    @property
    def readers(self) -> list[str]:
        """The readers admitted now (joined and not gone)."""
        with self._lock:
            return sorted(self._members)

    def grant(self, readers: Iterable[str | int]) -> None:
        """Let the containers ``readers`` (live, registered now) subscribe: they may map the
        ring read-only; nobody else can."""
        ids = [protocol.check_container_id(c) for c in readers]
        if not ids:
            return
        with self._lock:
            self._obj.share(ids, live=True)
            self._granted.update(ids)
        futex.wake(self._address + 8 * r.DOORBELL)

    def wait_for_readers(self, count: int, timeout: float | None = None) -> list[str]:
        """Until ``count`` readers have joined; their ids. ``TimeoutError`` after ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                self._admit_joiners()
                if len(self._members) >= count:
                    return sorted(self._members)
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(
                    f"{len(self._members)} of {count} readers joined {self.name!r} in {timeout} s"
                )
            time.sleep(0.005)

    def publish(self, data: bytes | bytearray | memoryview, timeout: float | None = None) -> int:
        """Write one message for every admitted reader; its last sequence number.

        A message longer than a slot goes as consecutive chunks. When a reader has not yet read
        the slot a chunk needs, the back-pressure policy decides: ``BLOCK`` waits for it (up to
        ``timeout`` seconds, then ``ChannelFull``), ``FAIL`` raises ``ChannelFull`` at once (a
        message whose first chunks went out stays incomplete: its readers skip it)."""
        if self._closed:
            raise InvalidArgument(f"the topic {self.name!r} is closed")
        payload = memoryview(data).cast("B")
        total = len(payload)
        geometry = self.geometry
        if total > geometry.max_message:
            raise InvalidArgument(
                f"a message of {total} bytes is larger than the topic's max_message "
                f"({geometry.max_message}); open the topic with a larger one"
            )
        deadline = None if timeout is None else time.monotonic() + timeout
        size = geometry.slot_bytes
        words, view = self._words, self._view
        offset = 0
        flags = r.FIRST
        while True:
            seq = self._head + 1
            if seq - geometry.slots > self._floor:
                self._make_room(seq - geometry.slots, deadline)
            chunk = payload[offset : offset + size]
            length = len(chunk)
            offset += length
            if offset >= total:
                flags |= r.LAST
            base = geometry.slot_word(seq)
            words[base + r.SEQ] = 0  # in flux: a reader that is here now sees the change
            start = base * 8 + r.SLOT_HEADER_BYTES
            view[start : start + length] = chunk
            words[base + r.TOTAL] = total
            words[base + r.LENGTH] = length
            words[base + r.FLAGS] = flags
            words[base + r.SEQ] = seq
            words[r.HEAD] = seq
            self._head = seq
            futex.wake(self._address + 8 * r.HEAD)
            if flags & r.LAST:
                return seq
            flags = 0

    def close(self, linger: float = LINGER_S) -> None:
        """Tell the readers nothing more comes (they read what is left, then get
        ``ChannelClosed``), let go of their cursors and free the ring once they have let go
        of it (waiting up to ``linger`` seconds; after that it goes when they do and this
        client closes)."""
        if self._closed:
            return
        self._closed = True
        self._words[r.CLOSED] = 1
        futex.wake(self._address + 8 * r.HEAD)
        self._stop = True
        futex.wake(self._address + 8 * r.DOORBELL)
        self._housekeeper.join()
        with self._lock:
            for member in list(self._members.values()):
                self._drop(member)
        self._words.release()
        self._view.release()
        r.destroy_once_alone(self._obj, linger)

    def __enter__(self) -> Topic:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------- back-pressure
    def _make_room(self, needed: int, deadline: float | None) -> None:
        """Until every admitted reader has consumed sequence ``needed`` (the slot's previous
        message), per the policy; drops readers that closed or died meanwhile."""
        next_check = time.monotonic() + LIVENESS_S
        while True:
            with self._lock:
                slowest = self._recompute_floor()
                if self._floor >= needed or slowest is None:
                    return
                address, seen = slowest.consumed_address, slowest.consumed()
            if self.policy is BackPressure.FAIL:
                raise ChannelFull(
                    f"reader {slowest.container!r} of {self.name!r} has not read message "
                    f"{needed} yet, and the topic's policy is not to wait"
                )
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise ChannelFull(
                    f"reader {slowest.container!r} of {self.name!r} read nothing new for the "
                    f"publish timeout; it is {self._head - seen} messages behind"
                )
            if now >= next_check:
                with self._lock:
                    self._drop_departed(check_minion=True)
                next_check = now + LIVENESS_S
            wait = next_check - now if deadline is None else min(deadline, next_check) - now
            futex.wait(address, seen & 0xFFFFFFFF, max(wait, 0.001))

    def _recompute_floor(self) -> _Member | None:
        """Set ``_floor`` from the readers' cursors (under the lock); the slowest reader, or
        ``None`` when no reader holds anything back."""
        self._drop_departed(check_minion=False)
        slowest: _Member | None = None
        for member in self._members.values():
            if slowest is None or member.consumed() < slowest.consumed():
                slowest = member
        self._floor = self._head if slowest is None else slowest.consumed()
        return slowest

    # ------------------------------------------------------------- membership
    def _housekeep_forever(self) -> None:
        doorbell = self._address + 8 * r.DOORBELL
        next_check = time.monotonic() + LIVENESS_S
        while not self._stop:
            futex.wait(doorbell, 0, LIVENESS_S)
            if self._stop:
                return
            now = time.monotonic()
            try:
                with self._lock:
                    self._admit_joiners()
                    self._drop_departed(check_minion=now >= next_check)
            except CDIError as exc:  # the minion went away: publish reports it
                log.warning("channel %s: %s", self.name, exc)
                return
            if now >= next_check:
                next_check = now + LIVENESS_S

    def _admit_joiners(self) -> None:
        """Admit every granted reader whose cursor is shared with us now (under the lock)."""
        for container in sorted(self._granted - self._members.keys()):
            key = r.cursor_key(self.name, container)
            cursor = self.client.use(key, check=False)
            try:
                view = cursor.read(timeout=0)
            except (NotOwner, ObjectNotFound):
                continue  # not joined yet
            if self.client.describe(key)["owner"] != container or len(view) < r.CURSOR_BYTES:
                view.release()
                cursor.release()  # someone else's object under that reader's name
                log.warning("ignoring %s: not a cursor of %s", key, container)
                continue
            words = view.cast("Q")
            if words[r.C_MAGIC] != r.CURSOR_MAGIC or words[r.C_CLOSED]:
                words.release()
                view.release()
                cursor.release()
                continue
            self._admit(container, cursor, view, words)

    def _admit(
        self, container: str, cursor: CDIObject, view: memoryview, words: memoryview
    ) -> None:
        used = {m.index for m in self._members.values()}
        free = [i for i in range(r.MAX_MEMBERS) if i not in used]
        if not free:
            log.warning("%s has %d readers already; %s waits", self.name, r.MAX_MEMBERS, container)
            words.release()
            view.release()
            cursor.release()
            return
        index = free[0]
        member = _Member(
            container,
            cursor,
            view,
            words,
            futex.address_of_view(view) + 8 * r.C_CONSUMED,
            index,
            self._head,
        )
        self._members[container] = member
        entry = r.MEMBERS + 2 * index
        self._words[entry + 1] = member.start
        self._words[entry] = r.reader_tag(container)  # the tag last: the entry is complete
        self._bump_epoch()

    def _drop_departed(self, *, check_minion: bool) -> None:
        """Let go of readers whose cursor says closed; with ``check_minion``, also of those that
        no longer hold the ring (they released it, or died)."""
        holding: set[str] | None = None
        if check_minion and self._members:
            listed = [o for o in self.client.list_objects() if o.get("key") == self.key]
            holding = set(listed[0]["readers"]) if listed else set()
        for member in list(self._members.values()):
            if member.closed() or (holding is not None and member.container not in holding):
                self._drop(member)

    def _drop(self, member: _Member) -> None:
        del self._members[member.container]
        entry = r.MEMBERS + 2 * member.index
        self._words[entry] = 0
        member.unmap()
        with suppress(CDIError):  # a cursor whose owner died goes once we let go
            member.cursor.release()
        self._bump_epoch()
        self._floor = 0  # recomputed on the next full ring

    def _bump_epoch(self) -> None:
        self._words[r.EPOCH] = (self._words[r.EPOCH] + 1) & 0xFFFFFFFF
        futex.wake(self._address + 8 * r.EPOCH)


def open_topic(
    client: Client,
    name: str,
    *,
    readers: Iterable[str | int] = (),
    slots: int = DEFAULT_SLOTS,
    slot_bytes: int = DEFAULT_SLOT_BYTES,
    max_message: int = DEFAULT_MAX_MESSAGE,
    policy: BackPressure = BackPressure.BLOCK,
) -> Topic:
    """Create topic ``name`` with this client's container as its one writer; ``readers`` are
    granted at once (``Topic.grant`` adds more). The ring holds ``slots`` messages of up to
    ``slot_bytes`` each (longer ones take several slots); ``KeyExists`` if the topic exists."""
    client._require_registered()
    topic = Topic(client, name, r.Geometry(slots, slot_bytes, max_message), policy)
    try:
        topic.grant(readers)
    except BaseException:
        topic.close(linger=0)
        raise
    return topic
