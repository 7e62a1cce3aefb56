"""Mappings this process keeps after giving their objects away, for reuse without an ``mmap``.

Mapping a segment costs a system call and, worse, a page fault for every page first touched
(a 26 MB image: ~6,400 faults, several ms). The minion recycles freed segments for new objects,
so a mapping outlives its object usefully: when the object comes back, or when a later object
(created here, or handed to us) lives in the same segment, the mapping is taken again — by key,
or by the minion's segment id, which is unique for the minion's life.

Entries hold no views: a cached mapping is usable only once the minion grants us an object in
its segment. The caller holds the client's lock around every method.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from itertools import islice
from typing import Generic, Protocol, TypeVar

__all__ = ["MappingCache"]

OFFER_LIMIT = 16  # segment ids offered to the minion with a create


class _Cached(Protocol):
    capacity: int
    segment: int | None


M = TypeVar("M", bound=_Cached)


class MappingCache(Generic[M]):
    """An LRU of mappings by object key, indexed by segment id, bounded in bytes."""

    def __init__(self, limit: int) -> None:
        self.limit = max(0, limit)
        self.bytes = 0
        self._by_key: OrderedDict[str, M] = OrderedDict()
        self._key_of_segment: dict[int, str] = {}
        self._segments_by_capacity: dict[int, dict[int, None]] = {}  # insertion-ordered sets

    def __len__(self) -> int:
        return len(self._by_key)

    def __contains__(self, key: object) -> bool:
        return key in self._by_key

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._by_key))

    def fits(self, mapping: M) -> bool:
        return mapping.capacity <= self.limit

    def get(self, key: str) -> M | None:
        return self._by_key.get(key)

    def put(self, key: str, mapping: M) -> list[tuple[str, M]]:
        """Cache ``mapping`` under ``key``; return what the caller must unmap (a stale entry of
        the same key or segment, and the least recently used beyond the limit)."""
        stale_keys = {key}
        if mapping.segment in self._key_of_segment:
            stale_keys.add(self._key_of_segment[mapping.segment])
        evicted = [(k, old) for k in stale_keys if (old := self.pop(k)) is not None]
        self._by_key[key] = mapping
        self.bytes += mapping.capacity
        if mapping.segment is not None:
            self._key_of_segment[mapping.segment] = key
            self._segments_by_capacity.setdefault(mapping.capacity, {})[mapping.segment] = None
        while self.bytes > self.limit and self._by_key:
            old_key = next(iter(self._by_key))
            old = self.pop(old_key)
            assert old is not None
            evicted.append((old_key, old))
        return evicted

    def pop(self, key: str) -> M | None:
        mapping = self._by_key.pop(key, None)
        if mapping is not None:
            self.bytes -= mapping.capacity
            if mapping.segment is not None and self._key_of_segment.get(mapping.segment) == key:
                del self._key_of_segment[mapping.segment]
                same = self._segments_by_capacity[mapping.capacity]
                del same[mapping.segment]
                if not same:
                    del self._segments_by_capacity[mapping.capacity]
        return mapping

    def pop_segment(self, segment: int, capacity: int) -> M | None:
        """The cached mapping of ``segment``, removed from the cache; ``None`` if we have none
        (or one of another capacity: never reuse a mapping that does not span the segment)."""
        key = self._key_of_segment.get(segment)
        if key is None or self._by_key[key].capacity != capacity:
            return None
        return self.pop(key)

    def segments_of_capacity(self, capacity: int) -> list[int]:
        """Ids of cached segments of exactly ``capacity`` bytes, most recently cached first."""
        return list(islice(reversed(self._segments_by_capacity.get(capacity, {})), OFFER_LIMIT))

    def clear(self) -> list[M]:
        gone = list(self._by_key.values())
        self._by_key.clear()
        self._key_of_segment.clear()
        self._segments_by_capacity.clear()
        self.bytes = 0
        return gone
