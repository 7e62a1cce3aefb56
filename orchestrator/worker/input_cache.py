"""The per-host input cache's bookkeeping: what an entry is keyed by, and the LRU index that
decides hits, who fetches a missing input, and what is evicted (``input_cache_host`` holds the
objects and serves the workers; ``docs/input-cache.md`` says why it is built this way).

*The key* is the store's identity (endpoint, region, access key: ``ObjectStore.identity``),
the URI, the object's tag as S3 gives it (ETag and version) and the worker's input limits. An
object that changes in S3 gets a new tag, so a new key; the entry of the old tag (same
*family*: everything but the tag) is dropped as soon as the new tag is seen.

*The index* holds at most ``budget`` bytes of entries. The first caller of a missing key is
told to fetch it (``FILL``) and the others wait for its entry (single flight); a fill that
fails (``abandon``, or its connection closes) lets the next waiter fetch. Entries are evicted
least recently used first; one a reader still holds a share of cannot be destroyed yet, so it
leaves the index at once and its bytes count until ``destroy`` succeeds (``reap``).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from cdi import ObjectKey

__all__ = ["CacheIndex", "CacheKey", "Entry", "Verdict"]


@dataclass(frozen=True)
class CacheKey:
    """What a cached input stands for; ``digest`` names it, ``family`` ignores the tag."""

    identity: str  # who read it from S3 (ObjectStore.identity)
    uri: str
    etag: str | None
    version: str | None
    max_input_bytes: int
    max_pixels: int

    def _hash(self, *parts: object) -> str:
        return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:40]

    @property
    def family(self) -> str:
        return self._hash(self.identity, self.uri, self.max_input_bytes, self.max_pixels)

    @property
    def digest(self) -> str:
        return self._hash(self.family, self.etag, self.version)

    @property
    def cacheable(self) -> bool:
        """Without a tag a change cannot be seen: such an input is never cached."""
        return bool(self.etag or self.version)


@dataclass(frozen=True)
class Entry:
    """A cached input: the CDI object holding its decoded image, and how many bytes a hit
    spares S3 (the encoded input's size)."""

    digest: str
    family: str
    key: ObjectKey
    size: int  # the object's bytes, counted against the budget
    source_bytes: int


class Verdict(Enum):
    FILL = "fill"  # no entry: the caller fetches it and offers it (or abandons)
    SKIP = "skip"  # waited too long for another's fill: fetch without the cache


class CacheIndex:
    """The LRU index. ``destroy(key)`` frees an evicted object and says whether it
    could (False: a reader still holds a share; tried again at the next ``reap``)."""

    def __init__(self, budget: int, destroy: Callable[[ObjectKey], bool]) -> None:
        self.budget = budget
        self._destroy = destroy
        self._entries: OrderedDict[str, Entry] = OrderedDict()  # least recently used first
        self._pending: dict[str, object] = {}  # digest -> the caller fetching it
        self._doomed: dict[ObjectKey, int] = {}  # evicted objects still shared -> their bytes
        self._too_big: set[str] = set()  # digests larger than the budget: never waited for
        self._used = 0
        self._cond = threading.Condition()

    @property
    def used(self) -> int:
        """Bytes of every object the cache holds, evicted ones not yet freed included."""
        return self._used

    def __len__(self) -> int:
        return len(self._entries)

    def acquire(self, key: CacheKey, caller: object, wait_s: float) -> Entry | Verdict:
        """The entry of ``key`` (now the most recently used), ``FILL`` if ``caller`` is to
        fetch it, or ``SKIP`` after ``wait_s`` seconds waiting for another caller's fill."""
        digest, family = key.digest, key.family
        deadline = time.monotonic() + wait_s
        with self._cond:
            self._drop_family(family, keep=digest)  # S3 has a newer tag: the old one is stale
            while True:
                entry = self._entries.get(digest)
                if entry is not None:
                    self._entries.move_to_end(digest)
                    return entry
                if digest in self._too_big:
                    return Verdict.SKIP
                if digest not in self._pending:
                    self._pending[digest] = caller
                    return Verdict.FILL
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return Verdict.SKIP
                self._cond.wait(remaining)

    def find(self, digest: str) -> Entry | None:
        """The entry of ``digest`` if it is still here (now the most recently used)."""
        with self._cond:
            entry = self._entries.get(digest)
            if entry is not None:
                self._entries.move_to_end(digest)
            return entry

    def put(self, key: CacheKey, caller: object, entry: Entry) -> bool:
        """Add ``caller``'s fill, evicting as the budget needs; False if it does not fit (the
        caller still owns the object then and frees it)."""
        with self._cond:
            if self._pending.get(entry.digest) is caller:
                del self._pending[entry.digest]
            self._cond.notify_all()
            if entry.size > self.budget:
                self._refuse(entry.digest)
                return False
            if entry.digest in self._entries:
                return False
            self._drop_family(key.family, keep=entry.digest)
            self.reap()
            while self._used + entry.size > self.budget and self._entries:
                self._evict(next(iter(self._entries)))
            if self._used + entry.size > self.budget:
                return False  # what is left is evicted but still read
            self._entries[entry.digest] = entry
            self._used += entry.size
            return True

    def abandon(self, digest: str, caller: object, *, too_big: bool = False) -> None:
        """``caller`` will not fill ``digest`` after all: the next waiter may; ``too_big``:
        nobody will (the waiters and later callers fetch it themselves)."""
        with self._cond:
            if too_big:
                self._refuse(digest)
            if self._pending.get(digest) is caller:
                del self._pending[digest]
                self._cond.notify_all()

    def _refuse(self, digest: str) -> None:
        if len(self._too_big) >= 4096:
            self._too_big.clear()
        self._too_big.add(digest)

    def drop(self, digest: str) -> None:
        """Forget an entry whose object is gone (it could not be shared)."""
        with self._cond:
            entry = self._entries.pop(digest, None)
            if entry is not None:
                self._used -= entry.size

    def reap(self) -> None:
        """Free the evicted objects their readers have let go of."""
        with self._cond:
            for key, size in list(self._doomed.items()):
                if self._destroy(key):
                    del self._doomed[key]
                    self._used -= size

    def clear(self) -> None:
        """Evict everything (at the holder's end)."""
        with self._cond:
            for digest in list(self._entries):
                self._evict(digest)
            self.reap()

    def _drop_family(self, family: str, keep: str) -> None:
        for digest, entry in list(self._entries.items()):
            if entry.family == family and digest != keep:
                self._evict(digest)

    def _evict(self, digest: str) -> None:
        entry = self._entries.pop(digest)
        if self._destroy(entry.key):
            self._used -= entry.size
        else:
            self._doomed[entry.key] = entry.size
