"""The mappings a client owns objects through, and the ones it keeps for their return.

``maps``: key -> the mapping of an object this container owns alone (views of it are handed
out). ``cache``: mappings of cooperative objects we gave away or destroyed whose memory only our
uid was ever handed (see ``mapcache``): when the object comes back, or a new one of ours lives in
the same segment, the minion sends no fd and we neither mmap nor fault the pages in again. No
view of a cached mapping exists: it is usable again only after the minion grants an object in
its segment to us.
"""

from __future__ import annotations

import threading
from typing import Any

from cdi.client.mapcache import MappingCache
from cdi.client.mapping import Mapping
from cdi.errors import BufferInUse
from cdi.protocol import Isolation

__all__ = ["OwnedMappings"]


class OwnedMappings:
    """Our mappings by key, and the cache of those we may reuse; safe between threads."""

    def __init__(self, cache_bytes: int) -> None:
        self.maps: dict[str, Mapping] = {}
        self.cache: MappingCache[Mapping] = MappingCache(cache_bytes)
        self.lock = threading.Lock()

    def offer(self, capacity: int) -> list[int]:
        """Segment ids of cached mappings of ``capacity`` bytes, for a ``create`` to name."""
        with self.lock:
            return self.cache.segments_of_capacity(capacity)

    def cached_segment(self, key: str) -> int | None:
        """The segment id of our cached mapping of ``key``, to tell the minion we have it."""
        mapping = self.cache.get(key)
        return mapping.segment if mapping is not None else None

    def reuse(self, key: str, reply: dict[str, Any]) -> Mapping | None:
        """Take a cached mapping of the granted segment — ours of ``key``, or of an earlier
        object in the same segment — and make it ``key``'s; ``None`` if we have none."""
        segment, capacity = reply.get("segment"), reply["capacity"]
        if type(segment) is not int or reply.get("isolation") != Isolation.COOPERATIVE:
            return None
        with self.lock:  # taken once: this is on every hand-off's path
            mapping = self.cache.pop_segment(segment, capacity)
            if mapping is None or mapping.mm.closed:
                return None
            mapping.size = reply["size"]
            mapping.generation = reply["generation"]
            old = self.maps.pop(key, None)
            self.maps[key] = mapping
            stale = self.cache.pop(key)
        if old is not None or stale is not None:
            self._close_replaced(key, mapping, old, stale)
        return mapping

    def install(self, key: str, mapping: Mapping) -> None:
        """Make ``mapping`` the one we own ``key`` through; unmap any earlier one of ``key``."""
        with self.lock:
            old = self.maps.pop(key, None)
            self.maps[key] = mapping
            stale = self.cache.pop(key)
        self._close_replaced(key, mapping, old, stale)

    @staticmethod
    def _close_replaced(key: str, mapping: Mapping, *replaced: Mapping | None) -> None:
        for gone in replaced:
            if gone is not None and gone is not mapping:
                gone.close(key)

    def drop_cached(self, key: str) -> None:
        with self.lock:
            mapping = self.cache.pop(key)
        if mapping is not None:
            mapping.close(key)

    def keep(self, key: str, mapping: Mapping) -> None:
        """Cache the mapping of an object we gave away or destroyed (its views are already
        revoked), or unmap it; evict the least recently used mappings beyond the budget."""
        with self.lock:
            if (
                mapping.cacheable
                and not mapping.mm.closed
                and self.cache.fits(mapping)
                and key not in self.maps
            ):
                evicted = self.cache.put(key, mapping)
            else:
                evicted = [(key, mapping)]
        for old_key, old in evicted:
            old.close(old_key)

    def revoke(self, key: str, detach: bool = False) -> Mapping | None:
        """Take back our views of ``key`` and forget its mapping; the caller unmaps it.

        ``detach``: if views are still referenced, forget the mapping anyway and leave it to
        them (it is unmapped when the last goes); cooperative objects only."""
        with self.lock:
            mapping = self.maps.get(key)
            if mapping is None:
                return None
            try:
                mapping.revoke(key, all_or_nothing=not (detach and mapping.cacheable))
            except BufferInUse:
                if not (detach and mapping.cacheable):
                    raise
                del self.maps[key]
                return None
            del self.maps[key]
            return mapping

    def close(self) -> None:
        """Unmap everything (the client closes)."""
        with self.lock:
            mappings = [*self.maps.values(), *self.cache.clear()]
            self.maps.clear()
        for mapping in mappings:
            mapping.close_quietly()
