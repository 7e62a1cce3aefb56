"""The writer's side of a channel: ``Topic.publish`` into a ring its readers map read-only.

The writer owns the ring (a CDI object) and shares it *live* with the containers it grants.
Each reader that subscribes creates a one-page cursor object of its own and shares it live with
the writer: the writer reads there how far the reader has got, and only that reader can write
it. A housekeeping thread admits readers as they join (it maps their cursor and writes their
entry in the ring's member table) and lets go of those that leave or die.

A reader on another host is granted through this host's gateway: it answers with a relay, a
container of its own that joins here as one reader and carries every message to a ring of the
same name on that host, where the reader subscribes as on one host (``cdi.remote.channels``).
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
    UnknownContainer,
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

    def seats(self) -> int:
        """How many readers this member counts as: a relay to another host, those it has
        admitted there; any other reader, one."""
        return int(self.words[r.C_SEATS]) if self.words[r.C_RELAY] else 1


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
        self._slots, self._slot_bytes = geometry.slots, geometry.slot_bytes
        self._max_message = geometry.max_message
        self._first_word, self._stride_words = r.HEADER_BYTES // 8, geometry.stride // 8
        self._head_address = self._address + 8 * r.HEAD
        self._head = 0
        self._floor = 0  # every admitted reader has consumed at least this sequence
        self._granted: set[str] = set()
        self._joined: set[str] = set()  # every reader admitted since the topic opened (a relay
        # once it has admitted a reader on its host)
        self._members: dict[str, _Member] = {}
        self._lock = threading.Lock()  # the member table
        self._joining = threading.Lock()  # one admission round at a time
        self._closed = False
        self._stop = False
        self.members_changed = threading.Event()
        """Set whenever a reader is admitted or let go (whoever waits on it clears it)."""
        self._housekeeper = threading.Thread(
            target=self._housekeep_forever, name=f"channel-{name}", daemon=True
        )
        self._housekeeper.start()

    # ------------------------------------------------------------- the public API
    @property
    def readers(self) -> list[str]:
        """The readers admitted now (joined and not gone); readers on another host appear as
        the relay that carries the topic there."""
        with self._lock:
            return sorted(self._members)

    def grant(self, readers: Iterable[str | int]) -> None:
        """Let the containers ``readers`` (live, registered now, on this host or another)
        subscribe: they may map the ring, or its copy on their host, read-only; nobody else
        can. ``UnknownContainer`` if one is registered on no host."""
        ids = [protocol.check_container_id(c) for c in readers]
        if not ids:
            return
        try:
            self._obj.share(ids, live=True)
        except UnknownContainer:
            if not self.client.spans_hosts:
                raise
            for container in ids:  # some are on other hosts: one at a time
                self._grant_one(container)
        else:
            with self._lock:
                self._granted.update(ids)
        futex.wake(self._address + 8 * r.DOORBELL)

    def _grant_one(self, container: str) -> None:
        try:
            self._obj.share([container], live=True)
        except UnknownContainer:
            # Not on this host: our gateway carries the topic to the reader's host and joins
            # here as a relay (the same relay for every reader of that host).
            try:
                relay = self.client.bridge_channel(
                    self.name, container, slots=self._slots, slot_bytes=self._slot_bytes,
                    max_message=self._max_message,
                )  # fmt: skip
            except UnknownContainer:
                # On no host, or registered here meanwhile (then this share goes through).
                self._obj.share([container], live=True)
            else:
                with self._lock:
                    if relay in self._granted:
                        return
                self._obj.share([relay], live=True)
                container = relay
        with self._lock:
            self._granted.add(container)

    def wait_for_readers(self, count: int, timeout: float | None = None) -> list[str]:
        """Until ``count`` readers have joined (a relay counts as the readers it admitted on
        its host); the ids of those admitted here. ``TimeoutError`` after ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._admit_joiners()
            with self._lock:
                joined = sum(member.seats() for member in self._members.values())
                if joined >= count:
                    return sorted(self._members)
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(
                    f"{joined} of {count} readers joined {self.name!r} in {timeout} s"
                )
            time.sleep(0.005)

    def wait_for_reader(self, reader: str, timeout: float | None = None) -> None:
        """Until ``reader`` has joined, or the relay carrying the topic to its host has
        admitted a reader there; a reader that joined and left since counts.
        ``TimeoutError`` after ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._admit_joiners()
            with self._lock:
                self._joined.update(m.container for m in self._members.values() if m.seats())
                # Granted through a relay (another host): the relay's first reader there.
                relayed = reader not in self._granted
                if reader in self._joined or (relayed and self._joined):
                    return
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"{reader} did not join {self.name!r} in {timeout} s")
            time.sleep(0.005)

    def publish(self, data: bytes | bytearray | memoryview, timeout: float | None = None) -> int:
        """Write one message for every admitted reader; its last sequence number.

        A message longer than a slot goes as consecutive chunks. When a reader has not yet read
        a slot the message needs, the back-pressure policy decides: ``BLOCK`` waits for it (up
        to ``timeout`` seconds, then ``ChannelFull``), ``FAIL`` raises ``ChannelFull`` at once
        and writes nothing. A message longer than the whole ring waits for room chunk by chunk
        under either policy; one cut short by ``ChannelFull`` is dropped by its readers."""
        if self._closed:
            raise InvalidArgument(f"the topic {self.name!r} is closed")
        total = len(data) if isinstance(data, bytes) else memoryview(data).nbytes
        if total > self._max_message:
            raise InvalidArgument(
                f"a message of {total} bytes is larger than the topic's max_message "
                f"({self._max_message}); open the topic with a larger one"
            )
        size, slots = self._slot_bytes, self._slots
        chunks = max(1, -(-total // size))
        last = self._head + min(chunks, slots)  # room for the whole message, if it fits
        if last - slots > self._floor:
            self._make_room(last - slots, None if timeout is None else time.monotonic() + timeout)
        if chunks == 1:
            self._write(self._head + 1, data, total, total, r.FIRST | r.LAST)
            self._notify()
            return self._head
        deadline = None if timeout is None else time.monotonic() + timeout
        payload = memoryview(data).cast("B")
        for index in range(chunks):
            seq = self._head + 1
            if seq - slots > self._floor:
                self._make_room(seq - slots, deadline, waits=True)
            flags = (r.FIRST if index == 0 else 0) | (r.LAST if index == chunks - 1 else 0)
            chunk = payload[index * size : (index + 1) * size]
            self._write(seq, chunk, len(chunk), total, flags)
            self._notify()
        return self._head

    def _write(
        self, seq: int, chunk: bytes | bytearray | memoryview, length: int, total: int, flags: int
    ) -> None:
        words = self._words
        base = self._first_word + (seq - 1) % self._slots * self._stride_words
        words[base] = 0  # r.SEQ, in flux: a reader copying this slot now sees the change
        start = base * 8 + r.SLOT_HEADER_BYTES
        self._view[start : start + length] = chunk
        words[base + r.TOTAL] = total
        words[base + r.LENGTH] = length
        words[base + r.FLAGS] = flags
        words[base] = seq
        words[r.HEAD] = seq
        self._head = seq

    def _notify(self) -> None:
        """Wake the readers if one sleeps (``ring``: the lock's atomic instructions are the
        fence between our store of ``head`` and our loads of their flags)."""
        with self._lock:
            sleeping = False
            for member in self._members.values():
                if member.words[r.C_SLEEPING]:
                    sleeping = True
                    break
        if sleeping:
            futex.wake(self._head_address)

    def close(self, linger: float = LINGER_S, *, broken: bool = False) -> None:
        """Tell the readers nothing more comes (they read what is left, then get
        ``ChannelClosed``; ``ChannelBroken`` with ``broken``, which a gateway says when the
        link that fed this ring from another host failed), let go of their cursors and free
        the ring once they have let go of it (waiting up to ``linger`` seconds; after that it
        goes when they do and this client closes)."""
        if self._closed:
            return
        self._closed = True
        self._words[r.CLOSED] = r.CLOSED_BROKEN if broken else r.CLOSED_BY_WRITER
        futex.wake(self._address + 8 * r.HEAD)
        self._stop = True
        futex.wake(self._address + 8 * r.DOORBELL)
        self._housekeeper.join()
        with self._lock:
            gone = [self._remove(member) for member in list(self._members.values())]
        for member in gone:
            _let_go(member.cursor, member.view, member.words)
        self._words.release()
        self._view.release()
        r.destroy_once_alone(self._obj, linger)

    def __enter__(self) -> Topic:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------- back-pressure
    def _make_room(self, needed: int, deadline: float | None, *, waits: bool = False) -> None:
        """Until every admitted reader has consumed sequence ``needed`` (the slot's previous
        message), per the policy (``waits``: whatever the policy); drops readers that closed or
        died meanwhile."""
        next_check = time.monotonic() + LIVENESS_S
        words = self._words
        while True:
            with self._lock:
                slowest = self._recompute_floor()
                if self._floor >= needed or slowest is None:
                    return
                address, seen = slowest.consumed_address, slowest.consumed()
                word = slowest.words[r.C_CONSUMED]  # what the futex compares (may be < seen)
            if self.policy is BackPressure.FAIL and not waits:
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
                self._drop_departed(check_minion=True)
                next_check = now + LIVENESS_S
                continue
            wait = next_check - now if deadline is None else min(deadline, next_check) - now
            words[r.WAITING] = 1  # the reader wakes us once it has read something
            try:
                futex.wait(address, word & 0xFFFFFFFF, max(wait, 0.001))
            except OSError:
                pass  # the housekeeper dropped that reader and unmapped its cursor: look again
            finally:
                words[r.WAITING] = 0

    def _recompute_floor(self) -> _Member | None:
        """Set ``_floor`` from the readers' cursors (under the lock); the slowest reader that
        has not closed, or ``None`` when no reader holds anything back."""
        slowest: _Member | None = None
        for member in self._members.values():
            if not member.closed() and (slowest is None or member.consumed() < slowest.consumed()):
                slowest = member
        self._floor = self._head if slowest is None else slowest.consumed()
        return slowest

    # ------------------------------------------------------------- membership
    # The minion is asked outside ``_lock``: publish takes it for every message.
    def _housekeep_forever(self) -> None:
        doorbell = self._address + 8 * r.DOORBELL
        next_check = time.monotonic() + LIVENESS_S
        while not self._stop:
            futex.wait(doorbell, 0, LIVENESS_S)
            if self._stop:
                return
            now = time.monotonic()
            try:
                self._admit_joiners()
                self._drop_departed(check_minion=now >= next_check)
            except CDIError as exc:  # the minion went away: publish reports it
                log.warning("channel %s: %s", self.name, exc)
                return
            if now >= next_check:
                next_check = now + LIVENESS_S

    def _admit_joiners(self) -> None:
        """Admit every granted reader whose cursor is shared with us now."""
        with self._joining:
            with self._lock:
                pending = sorted(self._granted - self._members.keys())
            for container in pending:
                key = r.cursor_key(self.name, container)
                cursor = self.client.use(key, check=False)
                try:
                    view = cursor.read(timeout=0)
                except (NotOwner, ObjectNotFound):
                    continue  # not joined yet
                words = view.cast("Q")
                if (
                    self.client.describe(key)["owner"] != container
                    or len(view) < r.CURSOR_BYTES
                    or words[r.C_MAGIC] != r.CURSOR_MAGIC
                    or words[r.C_CLOSED]
                ):  # someone else's object under that reader's name, or one being left
                    _let_go(cursor, view, words)
                    continue
                with self._lock:
                    admitted = self._admit(container, cursor, view, words)
                if not admitted:
                    log.warning("%s has %d readers: %s waits", self.name, r.MAX_MEMBERS, container)
                    _let_go(cursor, view, words)

    def _admit(
        self, container: str, cursor: CDIObject, view: memoryview, words: memoryview
    ) -> bool:
        used = {m.index for m in self._members.values()}
        free = [i for i in range(r.MAX_MEMBERS) if i not in used]
        if not free:
            return False
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
        if member.seats():
            self._joined.add(container)
        entry = r.MEMBERS + 2 * index
        self._words[entry + 1] = member.start
        self._words[entry] = r.reader_tag(container)  # the tag last: the entry is complete
        self._bump_epoch()
        return True

    def _drop_departed(self, *, check_minion: bool) -> None:
        """Let go of readers whose cursor says closed; with ``check_minion``, also of those that
        no longer hold the ring (they released it, or died)."""
        # Under ``_joining``: a reader admitted after the minion's answer is not in it.
        with self._joining:
            holding: set[str] | None = None
            if check_minion and self._members:
                listed = self.client.list_objects(self.key)
                holding = set(listed[0]["readers"]) if listed else set()
            with self._lock:
                gone = [
                    self._remove(member)
                    for member in list(self._members.values())
                    if member.closed() or (holding is not None and member.container not in holding)
                ]
        for member in gone:
            _let_go(member.cursor, member.view, member.words)

    def _remove(self, member: _Member) -> _Member:
        """Take ``member`` out of the table (under the lock); the caller lets go of it."""
        del self._members[member.container]
        self._words[r.MEMBERS + 2 * member.index] = 0
        self._bump_epoch()
        return member

    def _bump_epoch(self) -> None:
        self._words[r.EPOCH] = (self._words[r.EPOCH] + 1) & 0xFFFFFFFF
        futex.wake(self._address + 8 * r.EPOCH)
        self.members_changed.set()


def _let_go(cursor: CDIObject, view: memoryview, words: memoryview) -> None:
    """Unmap a reader's cursor and give up our share of it (it goes if its owner is gone)."""
    words.release()
    view.release()
    with suppress(CDIError):
        cursor.release()


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
    r.registered(client)
    topic = Topic(client, name, r.Geometry(slots, slot_bytes, max_message), policy)
    try:
        topic.grant(readers)
    except BaseException:
        topic.close(linger=0)
        raise
    return topic
