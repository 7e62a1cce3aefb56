"""The layout of a channel's ring and of a reader's cursor, both CDI objects (memfds).

Ring (owned by the writer, shared *live* with the readers it grants, who map it read-only)::

    header, one page, 64-bit little-endian words:
      0 magic   1 slots   2 slot_bytes   3 max_message   4 head (last sequence written)
      5 closed (1: by the writer; 2: broken, the link that fed it from another host failed)
      6 epoch (bumped when the member table changes)   7 doorbell (never written)
      8 waiting (the writer sleeps until a reader makes room)
      16.. member table: MAX_MEMBERS pairs (reader id hash, first sequence it is owed - 1)
    then ``slots`` slots of ``stride`` bytes:
      0 sequence (0 while the writer fills it)   1 message length   2 chunk length
      3 flags (FIRST, LAST)   then ``slot_bytes`` of payload

Sequence numbers start at 1; message part ``s`` lives in slot ``(s - 1) % slots``. A message
longer than ``slot_bytes`` is written as consecutive chunks (FIRST on the first, LAST on the
last); the reader reassembles them. The writer fills a slot, then sets its sequence, then
``head``: on x86-64 plain stores become visible in that order, and the reader checks the slot's
sequence before and after copying the payload, so a slot overwritten under it is detected.

Cursor (owned by one reader, shared live with the writer, who maps it read-only)::

    0 magic   1 consumed (the last sequence the reader is done with)   2 closed
    3 sleeping (the reader sleeps until the writer writes)
    4 relay (1: a gateway carrying the topic to another host, ``cdi.remote.channels``)
    5 seats (a relay's: how many readers it has admitted on that host; counted as readers)

Futex words (``cdi.channels.futex``) are the low halves of ``head`` (readers sleep on it),
``epoch`` (a joining or leaving reader sleeps on it), ``doorbell`` (the writer's housekeeping
thread sleeps on it; a reader rings it after joining or leaving) and ``consumed`` (a writer held
back by that reader sleeps on it). A side wakes the other only when that one said it sleeps
(``sleeping``, ``waiting``): it stores its progress, then passes a full fence (``fence``), then
reads the flag; the sleeper stores its flag and sleeps in ``futex.wait``, where the kernel
passes a full fence before it compares the word. So either the waker sees the flag, or the
sleeper's kernel sees the new value: no wake-up is lost, and none is paid for when nobody sleeps.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from dataclasses import dataclass

from cdi import protocol
from cdi.client import CDIObject, Client
from cdi.errors import CDIError, ChannelError, InvalidArgument, NotRegistered, ObjectShared

__all__ = [
    "CURSOR_BYTES",
    "CURSOR_MAGIC",
    "FIRST",
    "HEADER_BYTES",
    "LAST",
    "MAX_MEMBERS",
    "RING_MAGIC",
    "SLOT_HEADER_BYTES",
    "Geometry",
    "channel_of",
    "cursor_key",
    "destroy_once_alone",
    "fence",
    "reader_tag",
    "registered",
    "ring_key",
]

RING_MAGIC = int.from_bytes(b"CDICHAN1", "little")
CURSOR_MAGIC = int.from_bytes(b"CDICURS1", "little")
HEADER_BYTES = 4096
CURSOR_BYTES = 4096
SLOT_HEADER_BYTES = 32
MAX_MEMBERS = 64
FIRST, LAST = 1, 2

# Header words.
MAGIC, SLOTS, SLOT_BYTES, MAX_MESSAGE, HEAD, CLOSED, EPOCH, DOORBELL, WAITING = range(9)
MEMBERS = 16
# Slot words (from the slot's first word).
SEQ, TOTAL, LENGTH, FLAGS = range(4)
# Cursor words.
C_MAGIC, C_CONSUMED, C_CLOSED, C_SLEEPING, C_RELAY, C_SEATS = range(6)
CLOSED_BY_WRITER, CLOSED_BROKEN = 1, 2

KEY_PREFIX = "channel/"
RETRY_S = 0.002
REAP_S = 0.5  # how often an object left behind is offered to destroy again

log = logging.getLogger(__name__)


def ring_key(name: str) -> str:
    """The CDI key of topic ``name``'s ring."""
    if not isinstance(name, str) or not name or "/" in name:
        raise InvalidArgument(f"a channel name is a non-empty string without '/', got {name!r}")
    return protocol.check_key(KEY_PREFIX + name)


def cursor_key(name: str, reader: str) -> str:
    """The CDI key of ``reader``'s cursor on topic ``name``."""
    return protocol.check_key(f"{ring_key(name)}/reader/{reader}")


def channel_of(key: str) -> tuple[str, str | None] | None:
    """The topic a CDI key serves: ``(name, None)`` for its ring, ``(name, reader)`` for a
    reader's cursor; None for a key of no channel."""
    if not key.startswith(KEY_PREFIX):
        return None
    name, _, rest = key[len(KEY_PREFIX) :].partition("/")
    if not name:
        return None
    if not rest:
        return name, None
    kind, _, reader = rest.partition("/")
    return (name, reader) if kind == "reader" and reader and "/" not in reader else None


_fence_lock = threading.Lock()


def fence() -> None:
    """A full memory fence: an uncontended lock's acquire and release are atomic
    read-modify-write instructions (CPython's locks are glibc semaphores), which x86-64 never
    reorders with loads or stores. A tenth of a futex wake-up's cost."""
    with _fence_lock:
        pass


def reader_tag(reader: str) -> int:
    """A reader's entry in the member table: a non-zero 64-bit hash of its container id."""
    digest = hashlib.blake2b(reader.encode(), digest_size=8, person=b"cdi-chan").digest()
    return int.from_bytes(digest, "little") | 1


@dataclass(frozen=True)
class Geometry:
    """How a ring is laid out: ``slots`` slots of ``slot_bytes`` payload each."""

    slots: int
    slot_bytes: int
    max_message: int

    def __post_init__(self) -> None:
        if not 2 <= self.slots <= 1 << 20:
            raise InvalidArgument(f"slots must be 2 to {1 << 20}, got {self.slots}")
        if not 8 <= self.slot_bytes <= 1 << 30:
            raise InvalidArgument(f"slot_bytes must be 8 to {1 << 30}, got {self.slot_bytes}")
        if self.max_message < 0:
            raise InvalidArgument(f"max_message must not be negative, got {self.max_message}")

    @property
    def stride(self) -> int:
        """Bytes from one slot to the next: header and payload, rounded to a cache line."""
        return (SLOT_HEADER_BYTES + self.slot_bytes + 63) // 64 * 64

    @property
    def size(self) -> int:
        return HEADER_BYTES + self.slots * self.stride

    def slot_word(self, seq: int) -> int:
        """The index (in 64-bit words) of the first word of sequence ``seq``'s slot."""
        return (HEADER_BYTES + (seq - 1) % self.slots * self.stride) // 8

    @classmethod
    def read(cls, words: memoryview, size: int) -> Geometry:
        """The geometry a ring's header states; ``ChannelError`` if it is not a ring."""
        if size < HEADER_BYTES or words[MAGIC] != RING_MAGIC:
            raise ChannelError("that object is not a channel's ring (no ring header)")
        try:
            geometry = cls(words[SLOTS], words[SLOT_BYTES], words[MAX_MESSAGE])
        except InvalidArgument as exc:
            raise ChannelError(f"the ring's header is corrupt: {exc}") from exc
        if geometry.size > size:
            raise ChannelError("the ring's header states more slots than the object holds")
        return geometry


def destroy_once_alone(obj: CDIObject, linger: float) -> bool:
    """Destroy a ring or cursor once the other side has let go of its live share, waiting up
    to ``linger`` seconds; whether it is gone. (This polls: it runs once, when an end leaves.
    A live share's ``access`` does not wait for the readers, so there is nothing to block on.)
    An object left behind is freed in the background once the other side lets go (a
    long-lived owner, such as a worker, would otherwise keep it until its client closes)."""
    deadline = time.monotonic() + linger
    while True:
        try:
            obj.destroy()
            return True
        except ObjectShared:
            if time.monotonic() >= deadline:
                log.info("%s is still mapped by the other side; it goes when that lets go", obj.key)
                _reaper.add(obj)
                return False
        except CDIError as exc:  # the minion went away: nothing is left to free
            log.info("could not free %s: %s", obj.key, exc)
            return False
        time.sleep(RETRY_S)


class _Reaper:
    """One thread a process that offers the objects left behind to ``destroy`` again every
    ``REAP_S``, until each is gone (or its client or minion is: then there is nothing to free)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._objects: list[CDIObject] = []
        self._running = False

    def add(self, obj: CDIObject) -> None:
        with self._lock:
            self._objects.append(obj)
            if not self._running:
                self._running = True
                threading.Thread(target=self._run, name="cdi-channel-reaper", daemon=True).start()

    def _run(self) -> None:
        while True:
            time.sleep(REAP_S)
            with self._lock:
                objects, self._objects = self._objects, []
            left = [obj for obj in objects if not _freed(obj)]
            with self._lock:
                self._objects.extend(left)
                if not self._objects:
                    self._running = False
                    return


def _freed(obj: CDIObject) -> bool:
    """Whether ``obj`` needs no more tries: destroyed now, or beyond freeing by us."""
    try:
        obj.destroy()
    except ObjectShared:
        return False
    except CDIError:
        return True
    return True


_reaper = _Reaper()


def registered(client: Client) -> Client:
    """``client``, once it has registered its container (``NotRegistered`` before)."""
    if client.container_id is None:
        raise NotRegistered("call register(container_id) before opening a channel")
    return client
