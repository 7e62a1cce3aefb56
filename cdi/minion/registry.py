"""What a minion holds and every change of an object's owner.

The registry knows the objects, the registered containers and the deferred ``access`` requests.
It never touches a socket: a grant or a refusal it owes a waiting container goes to ``outbox``,
which the loop sends before the reply to the request in hand (so a new owner hears of its object
before the old owner hears that the transfer is done).
"""

from __future__ import annotations

import logging
import os
import time
from collections import defaultdict
from typing import TYPE_CHECKING, Any

from cdi import protocol
from cdi.errors import CDIError, NotOwner, ObjectNotFound, ObjectShared
from cdi.minion.config import MinionConfig
from cdi.minion.objects import Connection, StoredObject, Waiter
from cdi.minion.segments import SegmentPool
from cdi.protocol import Isolation

if TYPE_CHECKING:
    from cdi.controller.reporter import DirectoryReporter

__all__ = ["Outgoing", "Registry", "shared_error"]

log = logging.getLogger(__name__)

Outgoing = tuple[Connection, int, dict[str, Any], int | None]
"""A message owed to a connection: request id, body, fd."""


def shared_error(obj: StoredObject) -> ObjectShared:
    """The refusal of a write, transfer, resize or destroy while readers hold the object."""
    return ObjectShared(
        f"{obj.key!r} is shared with {len(obj.readers)} reader(s); it is writable, and can be "
        "transferred, resized or destroyed, once they have released it"
    )


class Registry:
    """Objects, containers and deferred accesses of one minion."""

    def __init__(self, config: MinionConfig, reporter: DirectoryReporter | None) -> None:
        assert config.idle_limit is not None
        self.config = config
        self.reporter = reporter
        self.pool = SegmentPool(config.memory_limit, config.idle_limit)
        self.objects: dict[str, StoredObject] = {}
        self.containers: dict[str, Connection] = {}
        self.operators = frozenset({0, os.geteuid()})  # see every object and container
        self.waiters: dict[str, list[Waiter]] = defaultdict(list)
        self.outbox: list[Outgoing] = []
        self.spin_until = 0  # perf_counter_ns until which the loop polls (a container waits)

    # ----------------------------------------------------------------- lookups
    def get(
        self, request: dict[str, Any], conn: Connection, *, waiting: bool = False
    ) -> StoredObject:
        """The requested object, if ``conn`` may see it (``waiting``: or may wait for it: an
        access or read that waits is answered when it is granted, so it is deferred even
        for an object the caller cannot see yet)."""
        key = request.get("key")
        # Every stored key passed check_key when it was created: a hit needs no validation.
        obj = self.objects.get(key) if type(key) is str else None
        if obj is None or not (waiting or self.visible(conn, obj)):
            key = protocol.check_key(key)
            raise ObjectNotFound(f"no object with key {key!r}")
        return obj

    def visible(self, conn: Connection, obj: StoredObject) -> bool:
        """Whether ``conn`` may see ``obj``: the minion's uid and root see everything, others
        the objects their uid created, owned or read, or whose recovery container they are."""
        uid = conn.uid
        return (
            uid in obj.uids
            or uid in self.operators
            or conn.container == obj.recovery
            or conn.container in obj.readers
        )

    def hand(self, obj: StoredObject, conn: Connection | None) -> None:
        """Record that ``conn``'s uid is handed ``obj``'s memory (owner or reader): it sees
        the object, and its segment never serves another uid."""
        if conn is not None:
            obj.uids.add(conn.uid)
            obj.segment.uids.add(conn.uid)

    def owned(self, conn: Connection, request: dict[str, Any]) -> StoredObject:
        obj = self.get(request, conn)
        if obj.owner != conn.container:
            raise NotOwner(f"container {conn.container} does not own {obj.key!r}")
        return obj

    def owned_alone(self, conn: Connection, request: dict[str, Any]) -> StoredObject:
        """The object if the caller owns it and nobody reads it (else ``ObjectShared``)."""
        obj = self.owned(conn, request)
        if obj.readers:
            raise shared_error(obj)
        return obj

    # ----------------------------------------------------------------- objects
    def new_object(
        self,
        conn: Connection,
        key: str,
        size: int,
        isolation: Isolation,
        recovery: str,
        prefer: frozenset[int] = frozenset(),
        zeroed: bool = True,
        generation: int = 1,
    ) -> StoredObject:
        assert conn.container is not None
        cooperative = isolation is Isolation.COOPERATIVE
        segment = self.pool.acquire(
            size,
            sealed=cooperative,
            prefer=prefer if cooperative else frozenset(),
            uid=conn.uid,
            zeroed=zeroed,
        )
        obj = StoredObject(
            key=key,
            size=size,
            segment=segment,
            owner=conn.container,
            creator=conn.container,
            recovery=recovery,
            isolation=isolation,
            uids={conn.uid},
            generation=generation,
        )
        self.objects[key] = obj
        self.changed(obj)
        return obj

    def set_owner(self, obj: StoredObject, owner: str) -> None:
        """Make ``owner`` the owner. A strict object moves to a fresh segment first, unless it
        is shared: readers map it then, and it moves when the share ends."""
        if obj.isolation is Isolation.STRICT and owner != obj.owner and not obj.readers:
            self.move_to_fresh_segment(obj)
        obj.owner = owner
        self.hand(obj, self.containers.get(owner))
        obj.generation += 1
        self.grant_waiters(obj)  # first: the new owner is waiting; bookkeeping can follow
        obj.updated_at = time.time()
        self.changed(obj)

    def move_to_fresh_segment(self, obj: StoredObject) -> None:
        """Strict isolation: copy into a new segment and truncate the one the old owner mapped."""
        owner = self.containers.get(obj.owner)
        fresh = self.pool.acquire(obj.size, sealed=False, uid=owner.uid if owner else None)
        if obj.segment.intact(obj.size):
            fresh.copy_from(obj.segment, obj.size)
        else:
            log.warning("segment of %s was shrunk by its owner; its data is lost", obj.key)
        self.pool.discard(obj.segment)
        obj.segment = fresh

    def grant_waiters(self, obj: StoredObject) -> None:
        """Answer the deferred requests of ``obj`` that can be granted now: an ``access`` of
        its owner while nobody reads it, a ``read`` of its owner or of a reader of its share."""
        waiters = self.waiters.get(obj.key)
        if not waiters:
            return
        keep = []
        for waiter in waiters:
            conn, request_id, reading = waiter
            if conn.doomed or not (
                obj.readable_by(conn.container)
                if reading
                else conn.container == obj.owner and obj.writable_by_owner
            ):
                keep.append(waiter)
                continue
            conn.waiting.pop(request_id, None)
            have = conn.have.pop(request_id, None)
            fd: int | None = obj.grant_fd(have)
            if reading:
                self.hand(obj, conn)
                fd = obj.segment.read_only_fd()
            self.outbox.append((conn, request_id, obj.grant_fields(), fd))
        if keep:
            self.waiters[obj.key] = keep
        else:
            del self.waiters[obj.key]

    def remove(self, obj: StoredObject) -> None:
        del self.objects[obj.key]
        if obj.isolation is Isolation.STRICT:
            self.pool.discard(obj.segment)
        else:
            self.pool.release(obj.segment, obj.size)
        for conn, request_id, _ in self.waiters.pop(obj.key, []):
            conn.waiting.pop(request_id, None)
            conn.have.pop(request_id, None)
            msg = {"ok": False, "code": ObjectNotFound.code, "msg": f"{obj.key!r} was destroyed"}
            self.outbox.append((conn, request_id, msg, None))
        if self.reporter is not None:
            self.reporter.object_removed(obj.key)

    def changed(self, obj: StoredObject) -> None:
        if self.reporter is not None:
            self.reporter.object_changed(obj.key, obj.size, obj.owner, obj.generation)

    # ----------------------------------------------------------------- containers
    def register(self, conn: Connection, cid: str) -> None:
        conn.container = cid
        self.containers[cid] = conn
        if self.reporter is not None:
            self.reporter.container_registered(cid, conn.pid, conn.uid)

    def wait(self, waiter: Waiter, key: str, have: int | None = None) -> None:
        """Defer an ``access`` (until the caller owns ``key`` and nobody reads it) or a
        ``read`` (until it may read it)."""
        self.spin_until = time.perf_counter_ns() + self.config.busy_poll_us * 1000
        conn, request_id, _ = waiter
        conn.waiting[request_id] = key
        if have is not None:
            conn.have[request_id] = have
        self.waiters[key].append(waiter)

    def cancel(self, conn: Connection, request_id: int) -> bool:
        """Withdraw ``conn``'s deferred access ``request_id``; whether one was waiting."""
        key = conn.waiting.pop(request_id, None)
        if key is None:
            return False
        conn.have.pop(request_id, None)
        waiters = self.waiters.get(key)
        if waiters:
            waiters[:] = [w for w in waiters if not (w.conn is conn and w.request_id == request_id)]
        return True

    def forget(self, conn: Connection, *, reclaim: bool) -> None:
        """A connection closed: drop its deferred accesses; its objects go to their recovery
        containers (``reclaim``) or stay for the minion's shutdown."""
        for request_id in list(conn.waiting):
            self.cancel(conn, request_id)
        cid = conn.container
        if cid is None or self.containers.get(cid) is not conn:
            return
        del self.containers[cid]
        conn.container = None
        if self.reporter is not None:
            self.reporter.container_gone(cid)
        if reclaim:
            for obj in [o for o in self.objects.values() if o.owner == cid]:
                self.recover(obj)
            for obj in [o for o in self.objects.values() if cid in o.readers]:
                self.release_share(obj, cid)  # a reader's death ends its shares

    def recover(self, obj: StoredObject) -> None:
        """An object whose owner is gone goes to its recovery container if that one is live,
        else it is reclaimed; a shared one without a live recovery container stays until its
        share ends (its readers still map it). One that cannot move (a strict object needs a
        fresh segment, and memory may have run out) is reclaimed."""
        if self.objects.get(obj.key) is not obj:
            return
        dead = obj.owner
        if obj.recovery == dead or obj.recovery not in self.containers:
            if obj.readers:
                log.info("owner %s of %s died; it goes when its readers release it", dead, obj.key)
            else:
                log.info("owner %s of %s died and nobody can recover it; reclaiming", dead, obj.key)
                self.remove(obj)
            return
        log.info("owner %s of %s died; returning it to %s", dead, obj.key, obj.recovery)
        try:
            self.set_owner(obj, obj.recovery)
            return
        except CDIError as exc:
            log.warning("cannot return %s to %s (%s); reclaiming it", obj.key, obj.recovery, exc)
        except Exception:
            log.exception("cannot return %s to %s; reclaiming it", obj.key, obj.recovery)
        if self.objects.get(obj.key) is obj and obj.owner == dead:
            self.remove(obj)  # set_owner fails only before the hand-over

    def release_share(self, obj: StoredObject, reader: str) -> bool:
        """``reader`` gives up its share of ``obj``; whether it held one. When the last reader
        goes, the object is its owner's alone again: a strict one moves to a fresh segment (so
        no reader's mapping sees the owner's next writes), a waiting access of its owner is
        granted, and one whose owner died meanwhile is recovered."""
        if reader not in obj.readers:
            return False
        obj.readers.remove(reader)
        if obj.readers:
            return True
        obj.live = False
        if obj.isolation is Isolation.STRICT:
            try:
                self.move_to_fresh_segment(obj)
            except CDIError as exc:
                log.warning(
                    "cannot move %s out of its readers' segment (%s); they keep a read-only "
                    "mapping of it",
                    obj.key,
                    exc,
                )
        if obj.owner in self.containers:
            self.grant_waiters(obj)
        else:
            self.recover(obj)
        return True

    def close(self) -> None:
        """Free every segment (the minion stops)."""
        for obj in self.objects.values():
            obj.segment.close()
        self.objects.clear()
        self.pool.close()
        if self.reporter is not None:
            self.reporter.close()
