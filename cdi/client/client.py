"""The application-side CDI API: a ``Client`` per container and a ``CDIObject`` per key.

    with cdi.connect("unix:///run/cdi/minion.sock", "frame-extractor") as client:
        frame = client.create("frame-1", 2_000_000)
        frame.access()[:n] = pixels          # the owner writes in place
        frame.transfer("object-detector")    # atomic hand-over; our mapping is gone now

A ``Client`` is safe to share between threads, but a thread blocked in ``access()`` holds its
connection; give each thread that waits for objects a client of its own.
"""

from __future__ import annotations

import mmap
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from cdi import protocol
from cdi.client.connection import MinionConnection
from cdi.client.exports import exports_of
from cdi.errors import BufferInUse, InvalidArgument, NotRegistered, ProtocolError
from cdi.protocol import Isolation, Op
from cdi.url import resolve_socket_path

__all__ = ["CDIObject", "Client", "connect"]


@dataclass(eq=False)
class _Mapping:
    """This process's mapping of an object it owns, and the views it handed out."""

    mm: mmap.mmap
    size: int
    capacity: int
    generation: int
    views: list[memoryview] = field(default_factory=list)

    def view(self) -> memoryview:
        base = memoryview(self.mm)
        view = base[: self.size]
        self.views.extend((view, base))
        return view

    def revoke(self, key: str) -> None:
        """Release every view we handed out; refuse if anything else still holds the buffer."""
        try:
            for view in self.views:
                view.release()
        except BufferError as exc:
            raise _in_use(key) from exc
        self.views.clear()
        exports = exports_of(self.mm)
        if exports is None:
            self.close(key)  # this interpreter hides the count: find out by closing
        elif exports:
            raise _in_use(key)

    def close(self, key: str) -> None:
        if self.mm.closed:
            return
        try:
            self.mm.close()
        except BufferError as exc:
            raise _in_use(key) from exc


def _in_use(key: str) -> BufferInUse:
    return BufferInUse(
        f"views of {key!r} (a memoryview slice or a NumPy array) are still referenced; drop "
        "them, or use `with obj.view() as buf:`, before transfer, resize or destroy"
    )


class Client:
    """A container's connection to its host's minion."""

    def __init__(
        self, url: str | None = None, *, timeout: float = 10.0, spin_us: int | None = None
    ) -> None:
        """``spin_us``: how long ``access()`` polls before it sleeps (``$CDI_SPIN_US``, default
        200). A sleeping process takes ~40 us to wake on a VM; polling trades CPU for latency."""
        self.socket_path = resolve_socket_path(url)
        if spin_us is None:
            spin_us = int(os.environ.get("CDI_SPIN_US", "200"))
        self._conn = MinionConnection(self.socket_path, timeout, spin_us=spin_us)
        self._maps: dict[str, _Mapping] = {}
        self._maps_lock = threading.Lock()
        self.container_id: str | None = None
        self.host: str | None = None
        self.max_object: int | None = None

    # ------------------------------------------------------------- lifecycle
    def register(self, container_id: str | int) -> Client:
        """Announce this process as ``container_id``; required before any object operation."""
        cid = protocol.check_container_id(container_id)
        reply, _ = self._conn.call(Op.REGISTER, container=cid)
        self.container_id = cid
        self.host = reply["host"]
        self.max_object = reply["max_object"]
        return self

    def close(self) -> None:
        """Unmap everything and disconnect (objects we still own go to their recovery container)."""
        with self._maps_lock:
            for mapping in self._maps.values():
                for view in mapping.views:
                    # The caller may still hold an export; then the mapping dies with it.
                    with suppress(BufferError):
                        view.release()
                with suppress(BufferError):
                    mapping.mm.close()
            self._maps.clear()
        self._conn.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------- objects
    def create(
        self,
        key: str,
        size: int,
        *,
        isolation: Isolation | str | None = None,
        recovery: str | None = None,
    ) -> CDIObject:
        """Create an object of ``size`` bytes owned by this container; ``KeyExists`` if taken."""
        self._require_registered()
        key = protocol.check_key(key)
        args: dict[str, Any] = {"key": key, "size": size}
        if isolation is not None:
            args["isolation"] = str(Isolation(isolation))
        if recovery is not None:
            args["recovery"] = protocol.check_container_id(recovery)
        reply, fd = self._conn.call(Op.CREATE, **args)
        self._map(key, reply, fd)
        return CDIObject(self, key, reply["size"])

    def use(self, key: str) -> CDIObject:
        """A handle on an existing object (owned or not); ``ObjectNotFound`` if none."""
        self._require_registered()
        key = protocol.check_key(key)
        reply, _ = self._conn.call(Op.USE, key=key)
        return CDIObject(self, key, reply["size"])

    def stat(self) -> dict[str, Any]:
        """Minion counters: objects, bytes in use, warm pool, containers."""
        reply, _ = self._conn.call(Op.STAT)
        return reply

    def list_objects(self) -> list[dict[str, Any]]:
        """Every live object on this host: key, size, owner, generation, age."""
        reply, _ = self._conn.call(Op.LIST)
        objects: list[dict[str, Any]] = reply["objects"]
        return objects

    # ------------------------------------------------------------- internals
    def _require_registered(self) -> None:
        if self.container_id is None:
            raise NotRegistered("call register(container_id) before using objects")

    def _map(self, key: str, reply: dict[str, Any], fd: int | None) -> _Mapping:
        if fd is None:
            raise ProtocolError("the minion granted an object without its memory")
        try:
            mm = mmap.mmap(fd, reply["capacity"], mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)  # the mapping is all we keep: no fd to re-map once ownership is gone
        mapping = _Mapping(mm, reply["size"], reply["capacity"], reply["generation"])
        with self._maps_lock:
            old = self._maps.pop(key, None)
            self._maps[key] = mapping
        if old is not None:
            old.close(key)
        return mapping

    def _revoke(self, key: str) -> _Mapping | None:
        """Take back our views of ``key`` and forget its mapping; the caller unmaps it."""
        with self._maps_lock:
            mapping = self._maps.get(key)
            if mapping is None:
                return None
            mapping.revoke(key)
            del self._maps[key]
            return mapping

    def _give_up(self, key: str, op: Op, **args: Any) -> dict[str, Any]:
        """Run an operation that ends our ownership: revoke our views (no code of ours can touch
        the bytes any more), send, then unmap. Unmapping 10 MB costs ~0.5 ms, which the new
        owner must not wait for."""
        mapping = self._revoke(key)
        try:
            reply, _ = self._conn.call(op, key=key, **args)
        finally:
            if mapping is not None:
                mapping.close(key)
        return reply


class CDIObject:
    """A handle on one CDI object; only the owner's operations succeed, others get ``NotOwner``."""

    def __init__(self, client: Client, key: str, size: int) -> None:
        self.client = client
        self.key = key
        self._size = size

    def __repr__(self) -> str:
        return f"CDIObject(key={self.key!r}, size={self.size})"

    @property
    def size(self) -> int:
        mapping = self.client._maps.get(self.key)
        return mapping.size if mapping is not None else self._size

    @property
    def owned(self) -> bool:
        """True while this process holds the object's memory (it owns it)."""
        return self.key in self.client._maps

    def access(self, timeout: float | None = None) -> memoryview:
        """Block until this container owns the object; return a writable view of its bytes.

        ``timeout`` (seconds) raises ``AccessTimeout`` when ownership has not arrived by then.
        The view is revoked (released) when the object is transferred, resized or destroyed.
        """
        if timeout is not None and timeout < 0:
            raise InvalidArgument(f"timeout must not be negative, got {timeout}")
        mapping = self.client._maps.get(self.key)
        if mapping is None:
            reply, fd = self.client._conn.call_blocking(Op.ACCESS, timeout, key=self.key)
            mapping = self.client._map(self.key, reply, fd)
        self._size = mapping.size
        return mapping.view()

    def _owned_mapping(self) -> _Mapping:
        """Our mapping if we own the object now; ``NotOwner`` at once otherwise (no waiting)."""
        mapping = self.client._maps.get(self.key)
        if mapping is None:
            reply, fd = self.client._conn.call(Op.ACCESS, key=self.key, wait=False)
            mapping = self.client._map(self.key, reply, fd)
        return mapping

    @contextmanager
    def view(self, timeout: float | None = None) -> Iterator[memoryview]:
        """``with obj.view() as buf:`` — the view is released on exit."""
        buf = self.access(timeout)
        try:
            yield buf
        finally:
            buf.release()

    def numpy(
        self,
        dtype: npt.DTypeLike = np.uint8,
        shape: tuple[int, ...] | None = None,
        timeout: float | None = None,
    ) -> npt.NDArray[Any]:
        """A zero-copy NumPy array over the object's bytes (drop it before ``transfer``)."""
        array = np.frombuffer(self.access(timeout), dtype=dtype)
        return array.reshape(shape) if shape is not None else array

    def write(self, data: bytes | bytearray | memoryview, offset: int = 0) -> None:
        """Copy ``data`` into the object at ``offset``; ``NotOwner`` unless we own it now."""
        mapping = self._owned_mapping()
        end = offset + len(data)
        if offset < 0 or end > mapping.size:
            raise InvalidArgument(
                f"writing {len(data)} bytes at {offset} overflows the object's {mapping.size} bytes"
            )
        mapping.mm[offset:end] = data

    def read(self) -> bytes:
        """A copy of the object's bytes; ``NotOwner`` unless we own it now."""
        mapping = self._owned_mapping()
        return mapping.mm[: mapping.size]

    def transfer(self, container_id: str | int) -> None:
        """Hand ownership to ``container_id`` in one atomic step; our views are revoked first."""
        to = protocol.check_container_id(container_id)
        if to == self.client.container_id and self.owned:
            return  # already ours: nothing to hand over
        self.client._give_up(self.key, Op.TRANSFER, to=to)

    def copy(self, new_key: str) -> CDIObject:
        """A new, independent object with the same bytes, owned by this container."""
        new_key = protocol.check_key(new_key)
        reply, fd = self.client._conn.call(Op.COPY, key=self.key, new_key=new_key)
        self.client._map(new_key, reply, fd)
        return CDIObject(self.client, new_key, reply["size"])

    def resize(self, new_size: int) -> None:
        """Change the object's size (the owner only); bytes up to the smaller size are kept."""
        reply = self.client._give_up(self.key, Op.RESIZE, size=new_size)
        self._size = reply["size"]

    def destroy(self) -> None:
        """Free the object (the owner only)."""
        self.client._give_up(self.key, Op.DESTROY)

    def set_recovery(self, container_id: str | int) -> None:
        """Who gets the object back if its owner dies (default: its creator)."""
        cid = protocol.check_container_id(container_id)
        self.client._conn.call(Op.SET_RECOVERY, key=self.key, container=cid)


def connect(
    url: str | None = None,
    container_id: str | int | None = None,
    *,
    timeout: float = 10.0,
    spin_us: int | None = None,
) -> Client:
    """Connect to the local minion (``url``, else ``$CDI_URL``) and register if an id is given."""
    client = Client(url, timeout=timeout, spin_us=spin_us)
    if container_id is not None:
        try:
            client.register(container_id)
        except BaseException:
            client.close()
            raise
    return client
