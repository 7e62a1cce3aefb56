"""What a minion holds and every change of an object's owner.

The registry knows the objects, the registered containers and the deferred ``access`` requests.
It never touches a socket: a grant or a refusal it owes a waiting container goes to ``outbox``,
which the loop sends before the reply to the request in hand (so a new owner hears of its object
before the old owner hears that the transfer is done).
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from typing import TYPE_CHECKING, Any

from cdi import protocol
from cdi.errors import CDIError, NotOwner, ObjectNotFound
from cdi.minion.config import MinionConfig
from cdi.minion.objects import Connection, StoredObject
from cdi.minion.segments import SegmentPool
from cdi.protocol import Isolation

if TYPE_CHECKING:
    from cdi.controller.reporter import DirectoryReporter

__all__ = ["Outgoing", "Registry"]

log = logging.getLogger(__name__)

Outgoing = tuple[Connection, int, dict[str, Any], int | None]
"""A message owed to a connection: request id, body, fd."""


class Registry:
    """Objects, containers and deferred accesses of one minion."""

    def __init__(self, config: MinionConfig, reporter: DirectoryReporter | None) -> None:
        assert config.idle_limit is not None
        self.config = config
        self.reporter = reporter
        self.pool = SegmentPool(config.memory_limit, config.idle_limit)
        self.objects: dict[str, StoredObject] = {}
        self.containers: dict[str, Connection] = {}
        self.bound_uid: dict[str, int] = {}
        self.waiters: dict[str, list[tuple[Connection, int]]] = defaultdict(list)
        self.outbox: list[Outgoing] = []
        self.spin_until = 0  # perf_counter_ns until which the loop polls (a container waits)

    # ----------------------------------------------------------------- lookups
    def get(self, request: dict[str, Any]) -> StoredObject:
        key = request.get("key")
        # Every stored key passed check_key when it was created: a hit needs no validation.
        obj = self.objects.get(key) if type(key) is str else None
        if obj is None:
            key = protocol.check_key(key)
            raise ObjectNotFound(f"no object with key {key!r}")
        return obj

    def owned(self, conn: Connection, request: dict[str, Any]) -> StoredObject:
        obj = self.get(request)
        if obj.owner != conn.container:
            raise NotOwner(f"container {conn.container} does not own {obj.key!r}")
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
            writers={conn.uid},
        )
        self.objects[key] = obj
        self.changed(obj)
        return obj

    def set_owner(self, obj: StoredObject, owner: str) -> None:
        if obj.isolation is Isolation.STRICT and owner != obj.owner:
            self._move_to_fresh_segment(obj)
        obj.owner = owner
        owner_conn = self.containers.get(owner)
        if owner_conn is not None:
            obj.writers.add(owner_conn.uid)
        obj.generation += 1
        self._grant_waiters(obj)  # first: the new owner is waiting; bookkeeping can follow
        obj.updated_at = time.time()
        self.changed(obj)

    def _move_to_fresh_segment(self, obj: StoredObject) -> None:
        """Strict isolation: copy into a new segment and truncate the one the old owner mapped."""
        fresh = self.pool.acquire(obj.size, sealed=False)
        if obj.segment.intact(obj.size):
            fresh.copy_from(obj.segment, obj.size)
        else:
            log.warning("segment of %s was shrunk by its owner; its data is lost", obj.key)
        self.pool.discard(obj.segment)
        obj.segment = fresh

    def _grant_waiters(self, obj: StoredObject) -> None:
        waiters = self.waiters.get(obj.key)
        if not waiters:
            return
        keep = []
        for conn, request_id in waiters:
            if conn.container == obj.owner and not conn.doomed:
                conn.waiting.pop(request_id, None)
                have = conn.have.pop(request_id, None)
                self.outbox.append((conn, request_id, obj.grant_fields(), obj.grant_fd(have)))
            else:
                keep.append((conn, request_id))
        if keep:
            self.waiters[obj.key] = keep
        else:
            del self.waiters[obj.key]

    def remove(self, obj: StoredObject) -> None:
        del self.objects[obj.key]
        if obj.isolation is Isolation.STRICT:
            self.pool.discard(obj.segment)
        else:
            self.pool.release(obj.segment, obj.size, obj.writers)
        for conn, request_id in self.waiters.pop(obj.key, []):
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

    def wait(self, conn: Connection, request_id: int, key: str, have: int | None) -> None:
        """Defer an ``access`` until ``conn``'s container owns ``key``."""
        self.spin_until = time.perf_counter_ns() + self.config.busy_poll_us * 1000
        conn.waiting[request_id] = key
        if have is not None:
            conn.have[request_id] = have
        self.waiters[key].append((conn, request_id))

    def cancel(self, conn: Connection, request_id: int) -> bool:
        """Withdraw ``conn``'s deferred access ``request_id``; whether one was waiting."""
        key = conn.waiting.pop(request_id, None)
        if key is None:
            return False
        conn.have.pop(request_id, None)
        waiters = self.waiters.get(key, [])
        if (conn, request_id) in waiters:
            waiters.remove((conn, request_id))
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
            self._recover_objects_of(cid)

    def _recover_objects_of(self, dead: str) -> None:
        """Objects of a dead owner go back to their recovery container, else are reclaimed.

        One object at a time: one that cannot be moved (a strict object needs a fresh segment,
        and memory may have run out) is reclaimed, and the others are still recovered."""
        for obj in [o for o in self.objects.values() if o.owner == dead]:
            if self.objects.get(obj.key) is not obj or obj.owner != dead:
                continue
            if obj.recovery != dead and obj.recovery in self.containers:
                log.info("owner %s of %s died; returning it to %s", dead, obj.key, obj.recovery)
                try:
                    self.set_owner(obj, obj.recovery)
                    continue
                except CDIError as exc:
                    log.warning(
                        "cannot return %s to %s (%s); reclaiming it", obj.key, obj.recovery, exc
                    )
                except Exception:
                    log.exception("cannot return %s to %s; reclaiming it", obj.key, obj.recovery)
                if self.objects.get(obj.key) is not obj or obj.owner != dead:
                    continue  # it failed after the hand-over: the new owner keeps it
            else:
                log.info("owner %s of %s died and nobody can recover it; reclaiming", dead, obj.key)
            self.remove(obj)

    def close(self) -> None:
        """Free every segment (the minion stops)."""
        for obj in self.objects.values():
            obj.segment.close()
        self.objects.clear()
        self.pool.close()
        if self.reporter is not None:
            self.reporter.close()
