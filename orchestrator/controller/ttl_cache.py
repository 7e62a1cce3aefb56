"""The API's caches (keys, image previews): cachetools' ``TTLCache`` behind a lock.

*Why a lock:* cachetools' caches are not thread-safe, and the API's event loop and the threads
its routes run on share these.
"""

from __future__ import annotations

import threading
from typing import Generic, TypeVar

from cachetools import TTLCache

__all__ = ["TtlCache"]

V = TypeVar("V")


class TtlCache(Generic[V]):
    """Values by string key: the most recently used ``entries``, each for ``ttl`` seconds."""

    def __init__(self, entries: int, ttl: float) -> None:
        self._items: TTLCache[str, V] = TTLCache(maxsize=entries, ttl=ttl)
        self._lock = threading.Lock()

    def get(self, key: str) -> V | None:
        with self._lock:
            return self._items.get(key)

    def put(self, key: str, value: V) -> None:
        with self._lock:
            self._items[key] = value

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
