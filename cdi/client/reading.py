"""The read-only mappings a client holds of objects shared with it (``CDIObject.read``)."""

from __future__ import annotations

import mmap
import os
import threading

from cdi.client.connection import MinionConnection
from cdi.client.mapping import Mapping
from cdi.errors import ProtocolError
from cdi.protocol import Op

__all__ = ["ReadMappings"]


class ReadMappings:
    """Read-only mappings by key: one per object this container reads through a share (or, as
    its owner, while it has shared it). The fd the minion sends is read-only, so the mapping is
    ``PROT_READ`` and the kernel refuses any write through it."""

    def __init__(self, conn: MinionConnection) -> None:
        self._conn = conn
        self._maps: dict[str, Mapping] = {}
        self._lock = threading.Lock()

    def get(self, key: str) -> Mapping | None:
        return self._maps.get(key)

    def read(self, key: str, timeout: float | None) -> Mapping:
        """Our read-only mapping of ``key``, waiting for a share when we have none."""
        mapping = self._maps.get(key)
        if mapping is not None:
            return mapping
        if timeout == 0:  # do not wait: NotOwner at once
            reply, fd = self._conn.call(Op.READ, key=key, wait=False)
        else:
            reply, fd = self._conn.call_blocking(Op.READ, timeout, key=key)
        if fd is None:
            raise ProtocolError("the minion granted a read without its memory")
        try:
            mm = mmap.mmap(fd, reply["capacity"], mmap.MAP_SHARED, mmap.PROT_READ)
        finally:
            os.close(fd)
        mapping = Mapping(
            mm, reply["size"], reply["capacity"], reply["generation"], reply.get("segment"),
            cacheable=False, writable=False,
        )  # fmt: skip
        with self._lock:
            old = self._maps.pop(key, None)
            self._maps[key] = mapping
        if old is not None:
            old.close(key)
        return mapping

    def drop(self, key: str) -> None:
        """Revoke our views of ``key`` and unmap it (``BufferInUse`` if one is still held)."""
        if key not in self._maps:  # the owner's hand-off: no lock to take for nothing
            return
        with self._lock:
            mapping = self._maps.get(key)
            if mapping is None:
                return
            mapping.revoke(key)
            del self._maps[key]
        mapping.close(key)

    def release(self, key: str) -> bool:
        """Unmap ``key`` and give up our share of it; whether we held one."""
        self.drop(key)
        reply, _ = self._conn.call(Op.RELEASE, key=key)
        return bool(reply["released"])

    def close(self) -> None:
        with self._lock:
            mappings, self._maps = list(self._maps.values()), {}
        for mapping in mappings:
            mapping.close_quietly()
