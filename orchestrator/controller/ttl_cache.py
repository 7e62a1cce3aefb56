"""A small thread-safe cache: the most recently used ``entries`` values, each for ``ttl`` s."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Generic, TypeVar

__all__ = ["TtlCache"]

V = TypeVar("V")


class TtlCache(Generic[V]):
    """Values by string key, least recently used dropped first, each kept ``ttl`` seconds."""

    def __init__(self, entries: int, ttl: float) -> None:
        self._entries = entries
        self._ttl = ttl
        self._items: OrderedDict[str, tuple[float, V]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> V | None:
        with self._lock:
            item = self._items.get(key)
            if item is None or time.monotonic() - item[0] > self._ttl:
                self._items.pop(key, None)
                return None
            self._items.move_to_end(key)
            return item[1]

    def put(self, key: str, value: V) -> None:
        with self._lock:
            self._items[key] = (time.monotonic(), value)
            self._items.move_to_end(key)
            while len(self._items) > self._entries:
                self._items.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
