"""Concurrent read-only sharing: ``share``, ``read`` and ``release`` (``cdi/PROTOCOL.md``).

The owner grants several containers read access at once. While any of them holds its share,
nobody writes: the owner's ``access`` waits (or is refused with ``shared``), and its ``transfer``,
``resize`` and ``destroy`` are refused with ``shared``. Readers get a read-only fd (opened through
/proc/self/fd, so the kernel refuses a writable mapping of it). When the last reader releases (or
dies), the object is its owner's alone again. A *live* share (a channel's ring) lets the owner
go on writing while readers hold it; transfer, resize and destroy still wait for their release.
"""

from __future__ import annotations

from typing import Any

from cdi import protocol
from cdi.errors import InvalidArgument, NotOwner, UnknownContainer
from cdi.minion.fields import Reply, optional_bool, waiting_id
from cdi.minion.objects import Connection, Waiter
from cdi.minion.registry import Registry
from cdi.protocol import Isolation

__all__ = ["Sharing"]


class Sharing:
    """The three sharing operations, over one registry."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry

    def share(self, conn: Connection, request: dict[str, Any]) -> Reply:
        reg = self.registry
        obj = reg.owned(conn, request)
        live = optional_bool(request, "live", False)
        readers: list[str] = []
        for cid in protocol.check_container_ids(request.get("readers")):
            if cid not in reg.containers:
                raise UnknownContainer(f"no live container {cid!r} is registered with this minion")
            if cid == obj.owner:
                raise InvalidArgument(
                    "the owner reads its own object without a share; name other containers"
                )
            if cid not in readers:
                readers.append(cid)
        if obj.readers and obj.live != live:
            kind = "live" if obj.live else "read-only (not live)"
            raise InvalidArgument(
                f"{obj.key!r} is already shared {kind}; a second share must be of the same kind"
            )
        obj.live = live
        if not obj.readers and obj.isolation is Isolation.STRICT:
            # The owner's mapping is of the old segment, which is truncated: it cannot write on.
            reg.move_to_fresh_segment(obj)
        for reader in readers:
            if reader not in obj.readers:
                obj.readers.append(reader)
                obj.uids.add(reg.containers[reader].uid)  # it sees the object now
        reg.grant_waiters(obj)
        return ({"readers": list(obj.readers)}, None)

    def read(self, conn: Connection, request: dict[str, Any]) -> Reply:
        reg = self.registry
        wait = optional_bool(request, "wait", True)
        obj = reg.get(request, conn, waiting=wait)
        if obj.readable_by(conn.container):
            fd = obj.segment.read_only_fd()
            reg.hand(obj, conn)
            return (obj.grant_fields(), fd)
        if not wait:
            raise NotOwner(
                f"container {conn.container} neither owns {obj.key!r} nor holds a share of it"
            )
        reg.wait(Waiter(conn, waiting_id(request), True), obj.key)
        return None

    def release(self, conn: Connection, request: dict[str, Any]) -> Reply:
        reg = self.registry
        obj = reg.get(request, conn)
        assert conn.container is not None
        released = reg.release_share(obj, conn.container)
        return ({"released": released, "readers": len(obj.readers)}, None)
