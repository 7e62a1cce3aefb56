"""``CDIObject``: a handle on one object, with the owner's operations and shared reading."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from cdi import protocol
from cdi.client.mapping import Mapping
from cdi.errors import InvalidArgument, ObjectShared
from cdi.keys import ObjectKey
from cdi.protocol import Isolation

__all__ = ["CDIObject", "ObjectOps"]

T = TypeVar("T")


def _check_timeout(timeout: float | None) -> None:
    if timeout is not None and timeout < 0:
        raise InvalidArgument(f"timeout must not be negative, got {timeout}")


class ObjectOps(Protocol):
    """What a handle asks of its client (``cdi.client.session.Session`` answers): the
    object's mappings and the minion's operations on one key. Nothing else of the client."""

    @property
    def container_id(self) -> str | None: ...
    @property
    def max_object(self) -> int | None: ...
    def mapping(self, key: str) -> Mapping | None: ...
    def known_size(self, key: str) -> int | None: ...
    def size_of(self, key: str) -> int: ...
    def access(self, key: str, timeout: float | None, populate: bool = False) -> Mapping: ...
    def copy(self, key: str, new_key: str) -> int: ...
    def resize(self, key: str, size: int) -> int: ...
    def destroy(self, key: str) -> None: ...
    def set_recovery(self, key: str, container_id: str) -> None: ...
    def transfer(self, key: str, to: str, detach: bool) -> None: ...
    def share(self, key: str, readers: list[str], live: bool = False) -> list[str]: ...
    def read(self, key: str, timeout: float | None) -> Mapping: ...
    def release(self, key: str) -> bool: ...


class CDIObject:
    """A handle on one CDI object; only the owner's operations succeed, others get ``NotOwner``.

    Shared reading: the owner calls ``share(readers)``; each reader calls ``read()`` (or ``with
    obj.reading() as view:``) for a read-only view and ``release()`` when done. While any reader
    holds its share, the owner's writes wait (``access``) or raise ``ObjectShared`` (``write``,
    ``transfer``, ``resize``, ``destroy``; give those a ``timeout`` to wait instead)."""

    def __init__(self, ops: ObjectOps, key: str, size: int | None) -> None:
        self._ops = ops
        self.key = ObjectKey(key)
        self._size = size  # None: not asked yet (``use(key, check=False)``)

    def __repr__(self) -> str:
        mapping = self._ops.mapping(self.key)
        size = mapping.size if mapping is not None else self._size  # no round trip in a repr
        return f"CDIObject(key={self.key!r}, size={size})"

    @property
    def size(self) -> int:
        known = self._ops.known_size(self.key)
        if known is not None:
            return known
        if self._size is None:
            self._size = self._ops.size_of(self.key)
        return self._size

    @property
    def isolation(self) -> str:
        """``cooperative`` or ``strict``, as far as this process knows (it maps the object)."""
        mapping = self._ops.mapping(self.key)
        strict = mapping is not None and not mapping.cacheable
        return str(Isolation.STRICT if strict else Isolation.COOPERATIVE)

    @property
    def owned(self) -> bool:
        """True while this process holds the object's memory to write (it owns it alone)."""
        return self._ops.mapping(self.key) is not None

    # ------------------------------------------------------------- the owner's
    def access(self, timeout: float | None = None, *, populate: bool = False) -> memoryview:
        """Block until this container owns the object (and no reader holds a share of it);
        return a writable view of its bytes.

        ``timeout`` (seconds) raises ``AccessTimeout`` when ownership has not arrived by then;
        ``timeout=0`` does not wait: ``NotOwner`` (or ``ObjectShared``) at once. The view is
        revoked (released) when the object is transferred, shared, resized or
        destroyed. ``populate``: if this process maps the object now, map every page at once
        (for a caller about to read it all; the return then waits for every page to be mapped).
        """
        _check_timeout(timeout)
        mapping = self._ops.access(self.key, timeout, populate)
        self._size = mapping.size
        return mapping.view()

    def _owned_mapping(self) -> Mapping:
        """Our mapping if we own the object now; ``NotOwner`` (or ``ObjectShared``) at once
        otherwise (no waiting)."""
        return self._ops.access(self.key, 0)

    @contextmanager
    def view(self, timeout: float | None = None, *, populate: bool = False) -> Iterator[memoryview]:
        """``with obj.view() as buf:`` — the view is released on exit."""
        buf = self.access(timeout, populate=populate)
        try:
            yield buf
        finally:
            buf.release()

    def numpy(
        self,
        dtype: npt.DTypeLike = np.uint8,
        shape: tuple[int, ...] | None = None,
        timeout: float | None = None,
        *,
        readonly: bool = False,
    ) -> npt.NDArray[Any]:
        """A zero-copy NumPy array over the object's bytes (drop it before ``transfer``).
        ``readonly``: through ``read()`` (a reader of a share, or the owner), not ``access()``."""
        buffer = self.read(timeout) if readonly else self.access(timeout)
        array = np.frombuffer(buffer, dtype=dtype)
        return array.reshape(shape) if shape is not None else array

    def write(self, data: bytes | bytearray | memoryview, offset: int = 0) -> None:
        """Copy ``data`` into the object at ``offset``; ``NotOwner`` unless we own it now,
        ``ObjectShared`` while readers hold it."""
        mapping = self._owned_mapping()
        end = offset + len(data)
        if offset < 0 or end > mapping.size:
            raise InvalidArgument(
                f"writing {len(data)} bytes at {offset} overflows the object's {mapping.size} bytes"
            )
        mapping.mm[offset:end] = data

    def transfer(
        self, container_id: str | int, *, detach: bool = False, timeout: float | None = None
    ) -> None:
        """Hand ownership to ``container_id`` in one atomic step; our views are revoked first.

        A view still referenced raises ``BufferInUse`` and nothing moves, unless ``detach``:
        then, for a cooperative object, the view is left mapped — reading it afterwards shows
        whatever the new owner writes — and unmapped when it is dropped. For a process that is
        about to exit with a thread it cannot stop still reading the object. While readers
        hold a share: ``ObjectShared``, or, with a ``timeout``, wait for their release."""
        to = protocol.check_container_id(container_id)
        if to == self._ops.container_id and self.owned:
            return  # already ours: nothing to hand over
        if timeout is None:  # the hand-off's path: nothing to wait for, nothing to wrap
            self._ops.transfer(self.key, to, detach)
            return
        self._alone(lambda: self._ops.transfer(self.key, to, detach), timeout)

    def copy(self, new_key: str) -> CDIObject:
        """A new, independent object with the same bytes, owned by this container."""
        new_key = protocol.check_key(new_key)
        return CDIObject(self._ops, new_key, self._ops.copy(self.key, new_key))

    def resize(self, new_size: int, *, timeout: float | None = None) -> None:
        """Change the object's size (the owner only); bytes up to the smaller size are kept.
        ``timeout``: as for ``transfer``, while readers hold a share."""
        protocol.check_sendable_size(new_size, self._ops.max_object)  # before views go
        self._size = self._alone(lambda: self._ops.resize(self.key, new_size), timeout)

    def destroy(self, *, timeout: float | None = None) -> None:
        """Free the object (the owner only). ``timeout``: as for ``transfer``."""
        self._alone(lambda: self._ops.destroy(self.key), timeout)

    def set_recovery(self, container_id: str | int) -> None:
        """Who gets the object back if its owner dies (default: its creator)."""
        self._ops.set_recovery(self.key, protocol.check_container_id(container_id))

    def _alone(self, operation: Callable[[], T], timeout: float | None) -> T:
        """Run an operation that needs the object to ourselves; while readers hold it, raise
        ``ObjectShared``, or (with a ``timeout``) wait for them once and try again."""
        _check_timeout(timeout)
        try:
            return operation()
        except ObjectShared:
            if timeout is None:
                raise
        self.access(timeout).release()  # returns once every reader has released it
        return operation()

    # ------------------------------------------------------------- sharing
    def share(self, readers: Iterable[str | int], *, live: bool = False) -> list[str]:
        """Grant the containers ``readers`` read-only access, all at once (the owner only).

        Our own views are revoked first (``BufferInUse`` if one is still referenced, and
        nothing is shared). Until every reader has released its share, nobody writes the
        object, we included. Returns every container that holds a share now.

        ``live``: we go on writing and the readers see each write as it happens (a channel's
        ring, ``cdi.channels``); our views stay valid, except that a strict object moves to
        fresh memory when its first share starts (``access()`` maps it anew)."""
        ids = [protocol.check_container_id(r) for r in readers]
        return self._ops.share(self.key, ids, live)

    def read(self, timeout: float | None = None) -> memoryview:
        """A read-only view of the object's bytes, for its owner or a reader of a share.

        Blocks until this container may read (a share names it); ``timeout`` (seconds) raises
        ``AccessTimeout`` when it has not by then; ``timeout=0`` does not wait: ``NotOwner`` at
        once. A copy of the bytes: ``bytes(obj.read())``. A reader's mapping is read-only in the
        kernel: no write through it can succeed. The view is revoked by ``release()``."""
        _check_timeout(timeout)
        mapping = self._ops.read(self.key, timeout)
        self._size = mapping.size
        return mapping.read_view()

    def release(self) -> bool:
        """Give up our share (a reader) and unmap what ``read()`` mapped; whether we held a
        share. When the last reader releases, the owner may write again."""
        return self._ops.release(self.key)

    @contextmanager
    def reading(self, timeout: float | None = None) -> Iterator[memoryview]:
        """``with obj.reading() as view:`` — read, then release on exit."""
        view = self.read(timeout)
        try:
            yield view
        finally:
            view.release()
            self.release()
