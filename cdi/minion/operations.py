"""The minion's operations, one method each, as ``cdi/PROTOCOL.md`` defines them.

Each takes the caller's connection and the decoded request and returns the reply body and at most
one fd, or ``None`` when the reply is deferred (a waiting ``access``). Errors are raised as the
``cdi.errors`` class whose code the reply carries.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from cdi import protocol
from cdi.errors import (
    ContainerExists,
    InvalidArgument,
    KeyExists,
    NameNotAllowed,
    NotOwner,
    ProtocolError,
    UnknownContainer,
)
from cdi.minion.fields import Reply, optional_bool, optional_int, waiting_id
from cdi.minion.names import uid_for
from cdi.minion.objects import Connection, Waiter
from cdi.minion.registry import Registry, shared_error
from cdi.minion.sharing import Sharing
from cdi.protocol import Isolation, Op

__all__ = ["OPEN_OPS", "Operations", "Reply"]

OPEN_OPS = frozenset({Op.REGISTER, Op.STAT, Op.LIST})  # allowed before register
Handler = Callable[[Connection, dict[str, Any]], Reply]


class Operations:
    """Every operation of the protocol, over one registry."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self.config = registry.config
        sharing = Sharing(registry)
        self.handlers: dict[str, Handler] = {
            Op.REGISTER: self.register,
            Op.CREATE: self.create,
            Op.USE: self.use,
            Op.COPY: self.copy,
            Op.ACCESS: self.access,
            Op.CANCEL: self.cancel,
            Op.TRANSFER: self.transfer,
            Op.RESIZE: self.resize,
            Op.DESTROY: self.destroy,
            Op.SET_RECOVERY: self.set_recovery,
            Op.SHARE: sharing.share,
            Op.READ: sharing.read,
            Op.RELEASE: sharing.release,
            Op.STAT: self.stat,
            Op.LIST: self.list,
        }

    def register(self, conn: Connection, request: dict[str, Any]) -> Reply:
        reg = self.registry
        cid = protocol.check_container_id(request.get("container"))
        if conn.container is not None:
            raise ProtocolError(f"this connection is already registered as {conn.container!r}")
        allowed = uid_for(self.config.names, cid, os.geteuid())
        if conn.uid != allowed:
            raise NameNotAllowed(
                f"container id {cid!r} is reserved for uid {allowed} by the minion's "
                f"configuration (--names), not uid {conn.uid}"
            )
        if cid in reg.containers:
            raise ContainerExists(
                f"container id {cid!r} is in use by a live process (pid {reg.containers[cid].pid})"
            )
        reg.register(conn, cid)
        return (
            {
                "host": self.config.host,
                "minion_pid": os.getpid(),
                "max_object": self.config.max_object,
                "isolation": str(self.config.isolation),
            },
            None,
        )

    def create(self, conn: Connection, request: dict[str, Any]) -> Reply:
        key = protocol.check_key(request.get("key"))
        size = protocol.check_size(request.get("size"), self.config.max_object)
        isolation = self._isolation(request.get("isolation"))
        recovery = request.get("recovery")
        recovery = conn.container if recovery is None else protocol.check_container_id(recovery)
        assert recovery is not None
        have = protocol.check_segment_ids(request.get("have"))
        zeroed = optional_bool(request, "zeroed", True)
        generation = self._first_generation(conn, request)
        if key in self.registry.objects:
            raise KeyExists(f"an object with key {key!r} already exists")
        obj = self.registry.new_object(
            conn, key, size, isolation, recovery, prefer=have, zeroed=zeroed, generation=generation
        )
        # No fd if the creator still maps the segment it got (a pooled one it used before).
        return (
            obj.grant_fields(),
            obj.grant_fd(obj.segment.id if obj.segment.id in have else None),
        )

    def _first_generation(self, conn: Connection, request: dict[str, Any]) -> int:
        """``generation``: where a gateway carries an object on from another host. Only the
        minion's own uid and root may set it: the directory orders an object's homes by it."""
        generation = optional_int(request, "generation")
        if generation is None:
            return 1
        if not 1 <= generation < 2**63:
            raise InvalidArgument(f"generation must be between 1 and 2**63 - 1, got {generation}")
        if conn.uid not in self.registry.operators:
            raise InvalidArgument("only the minion's own uid or root may set a generation")
        return generation

    def _isolation(self, value: object) -> Isolation:
        if value is None:
            return self.config.isolation
        if type(value) is str and value in Isolation.__members__.values():
            return Isolation(value)
        raise InvalidArgument(f"isolation must be 'cooperative' or 'strict', got {value!r}")

    def use(self, conn: Connection, request: dict[str, Any]) -> Reply:
        obj = self.registry.get(request, conn)
        fields = {"size": obj.size, "owner": obj.owner, "isolation": str(obj.isolation),
                  "recovery": obj.recovery, "generation": obj.generation}  # fmt: skip
        return (fields, None)

    def access(self, conn: Connection, request: dict[str, Any]) -> Reply:
        have = optional_int(request, "have")
        wait = optional_bool(request, "wait", True)
        obj = self.registry.get(request, conn, waiting=wait)
        owner = obj.owner == conn.container
        if owner and obj.writable_by_owner:
            return (obj.grant_fields(), obj.grant_fd(have))
        if not wait:
            if owner:
                raise shared_error(obj)
            raise NotOwner(f"container {conn.container} does not own {obj.key!r}")
        self.registry.wait(Waiter(conn, waiting_id(request), False), obj.key, have)
        return None

    def cancel(self, conn: Connection, request: dict[str, Any]) -> Reply:
        ref = request.get("ref")
        if type(ref) is not int:
            raise InvalidArgument(f"ref must be the id of an access, got {ref!r}")
        return ({"cancelled": self.registry.cancel(conn, ref)}, None)

    def transfer(self, conn: Connection, request: dict[str, Any]) -> Reply:
        reg = self.registry
        obj = reg.owned_alone(conn, request)
        to = request.get("to")
        # ``via``: where the object goes when ``to`` is not here (a gateway's slot, which
        # sends it on to ``to``'s host), saving the caller a failed transfer.
        via = request.get("via")
        if via is not None:
            via = protocol.check_container_id(via)
        # Registered ids passed check_container_id: a hit needs no validation.
        if type(to) is not str or to not in reg.containers:
            to = protocol.check_container_id(to)
        if to not in reg.containers:
            if via not in reg.containers:
                raise UnknownContainer(f"no live container {to!r} is registered with this minion")
            to = via
        if to != obj.owner:
            reg.set_owner(obj, to)
        # The sender may keep its mapping for reuse only if no other uid was ever handed this
        # memory (the receiver included): else it unmaps, and the segment is never reused.
        keep = obj.isolation is Isolation.COOPERATIVE and reg.pool.returns_to(obj.segment, conn.uid)
        return ({"generation": obj.generation, "keep_mapping": keep, "to": to}, None)

    def copy(self, conn: Connection, request: dict[str, Any]) -> Reply:
        reg = self.registry
        obj = reg.owned(conn, request)
        new_key = protocol.check_key(request.get("new_key"))
        if new_key in reg.objects:
            raise KeyExists(f"an object with key {new_key!r} already exists")
        assert conn.container is not None
        # Not zeroed: the copy overwrites its bytes (another uid's old bytes are zeroed anyway).
        new = reg.new_object(conn, new_key, obj.size, obj.isolation, conn.container, zeroed=False)
        new.segment.copy_from(obj.segment, obj.size)
        return (new.grant_fields(), new.segment.fd)

    def resize(self, conn: Connection, request: dict[str, Any]) -> Reply:
        reg = self.registry
        obj = reg.owned_alone(conn, request)
        size = protocol.check_size(request.get("size"), self.config.max_object)
        if size > obj.segment.capacity:
            bigger = reg.pool.acquire(
                size, sealed=obj.isolation is Isolation.COOPERATIVE, uid=conn.uid
            )
            bigger.copy_from(obj.segment, obj.size)
            if obj.isolation is Isolation.STRICT:
                reg.pool.discard(obj.segment)
            else:
                reg.pool.release(obj.segment, obj.size)
            obj.segment = bigger
        elif size > obj.size:
            obj.segment.zero(size, start=obj.size)  # growth reads as zeros, not old bytes
        obj.size = size
        obj.generation += 1
        obj.touch()
        reg.changed(obj)
        return (obj.grant_fields(), None)

    def destroy(self, conn: Connection, request: dict[str, Any]) -> Reply:
        obj = self.registry.owned_alone(conn, request)
        # Cached only if the segment goes back to our uid's pool (nobody else was handed it).
        keep = obj.isolation is Isolation.COOPERATIVE and self.registry.pool.returns_to(
            obj.segment, conn.uid
        )
        self.registry.remove(obj)
        return ({"keep_mapping": keep}, None)

    def set_recovery(self, conn: Connection, request: dict[str, Any]) -> Reply:
        obj = self.registry.owned(conn, request)
        obj.recovery = protocol.check_container_id(request.get("container"))
        return ({"recovery": obj.recovery}, None)

    def stat(self, conn: Connection, request: dict[str, Any]) -> Reply:
        reg = self.registry
        pool = reg.pool
        return (
            {
                "host": self.config.host,
                "objects": len(reg.objects),
                "containers": sorted(
                    cid
                    for cid, other in reg.containers.items()
                    if conn.uid in reg.operators or other.uid == conn.uid
                ),
                "used_bytes": pool.used_bytes,
                "used_segments": pool.used_segments,
                "idle_bytes": pool.idle_bytes,
                "allocations": pool.allocations,
                "reuses": pool.reuses,
                "zeroed_bytes": pool.zeroed_bytes,
                "waiters": sum(len(w) for w in reg.waiters.values()),
                "memory_limit": pool.memory_limit,
            },
            None,
        )

    def list(self, conn: Connection, request: dict[str, Any]) -> Reply:
        reg = self.registry
        host = self.config.host
        seen = [o.describe(host) for o in reg.objects.values() if reg.visible(conn, o)]
        return ({"objects": seen}, None)
