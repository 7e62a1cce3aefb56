"""The controller's soft state: minions, containers and the object directory, in memory.

Nothing here survives a restart on purpose: each ``ControllerState`` has a fresh random epoch and
minions re-announce what they hold when their epoch no longer matches. All methods are thread-safe
(one lock; every operation is short) and free of gRPC so they can be unit-tested directly.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from cdi.controller.models import (
    Changes,
    ContainerInfo,
    ContainerRecord,
    MinionInfo,
    ObjectInfo,
    ObjectRecord,
    Restarts,
    Route,
)
from cdi.controller.validation import (
    check_container_id,
    check_container_record,
    check_host,
    check_interval,
    check_key,
    check_object_record,
    check_owner,
    check_restarts,
    check_rpc_address,
    check_socket_path,
)
from cdi.errors import ObjectNotFound, UnknownContainer

__all__ = ["DEFAULT_HEARTBEAT_S", "MISSED_HEARTBEATS", "ControllerState"]

DEFAULT_HEARTBEAT_S = 2.0
# A minion that missed this many heartbeats in a row is reported as not alive (its data stays).
MISSED_HEARTBEATS = 3


@dataclass(slots=True)
class _Minion:
    host: str
    socket_path: str
    rpc_address: str
    heartbeat_s: float
    registered_at: float
    last_heartbeat: float  # wall clock, for display
    last_seen: float  # monotonic, for liveness: immune to wall-clock jumps
    restarts: Restarts


class ControllerState:
    """Thread-safe registry of minions and containers plus the object directory."""

    def __init__(
        self,
        epoch: str | None = None,
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._epoch = epoch or secrets.token_hex(8)
        self._clock = clock
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._minions: dict[str, _Minion] = {}
        self._containers: dict[str, ContainerInfo] = {}
        self._objects: dict[str, ObjectInfo] = {}
        # Per-host indexes so a re-registration replaces one host's entries without a full scan.
        self._containers_by_host: dict[str, set[str]] = {}
        self._objects_by_host: dict[str, set[str]] = {}

    @property
    def epoch(self) -> str:
        """This incarnation's random id; minions holding another one must re-register."""
        return self._epoch

    def register_minion(
        self,
        host: str,
        socket_path: str,
        rpc_address: str = "",
        heartbeat_s: float = 0.0,
        containers: Iterable[ContainerRecord] = (),
        objects: Iterable[ObjectRecord] = (),
        restarts: Restarts | None = None,
    ) -> str:
        """Replace everything known about ``host`` with this snapshot; return the epoch.

        ``heartbeat_s`` 0 means the default (2 s). ``restarts``: what the minion keeps across
        its restarts, as it says. Nothing changes if any input is invalid.
        """
        check_host(host)
        check_socket_path(socket_path)
        check_rpc_address(rpc_address)
        beat = DEFAULT_HEARTBEAT_S if heartbeat_s == 0 else check_interval(heartbeat_s, "heartbeat")
        container_list = [check_container_record(c) for c in containers]
        object_list = [check_object_record(o) for o in objects]
        kept = check_restarts(restarts or Restarts())
        with self._lock:
            now = self._clock()
            for container_id in self._containers_by_host.pop(host, set()):
                del self._containers[container_id]
            for key in self._objects_by_host.pop(host, set()):
                del self._objects[key]
            self._minions[host] = _Minion(
                host=host,
                socket_path=socket_path,
                rpc_address=rpc_address,
                heartbeat_s=beat,
                registered_at=now,
                last_heartbeat=now,
                last_seen=self._monotonic(),
                restarts=kept,
            )
            for container in container_list:
                self._upsert_container(host, container, now)
            for obj in object_list:
                self._upsert_object(host, obj, now)
        return self._epoch

    def report_changes(self, host: str, epoch: str, changes: Changes) -> bool:
        """Apply one minion's batch (an empty one is a heartbeat).

        Returns True, applying nothing, when the minion must re-register: it is unknown or its
        epoch is not this incarnation's. Nothing changes if any input is invalid.
        """
        check_host(host)
        upserts_c = [check_container_record(c) for c in changes.upsert_containers]
        removals_c = [check_container_id(c) for c in changes.removed_containers]
        upserts_o = [check_object_record(o) for o in changes.upsert_objects]
        removals_o = [check_key(k) for k in changes.removed_objects]
        with self._lock:
            minion = self._minions.get(host)
            if minion is None or epoch != self._epoch:
                return True
            now = self._clock()
            minion.last_heartbeat = now
            minion.last_seen = self._monotonic()
            # Upserts before removals: a batch is coalesced per id, so no id is in both lists.
            for container in upserts_c:
                self._upsert_container(host, container, now)
            for container_id in removals_c:
                self._remove_container(host, container_id)
            for obj in upserts_o:
                self._upsert_object(host, obj, now)
            for key in removals_o:
                self._remove_object(host, key)
        return False

    def lookup_container(self, container_id: str) -> ContainerInfo:
        """Return the container registered as ``container_id``; raise ``UnknownContainer``."""
        check_container_id(container_id)
        with self._lock:
            info = self._containers.get(container_id)
        if info is None:
            raise UnknownContainer(f"no container is registered as {container_id!r}")
        return info

    def route(self, container_id: str) -> Route:
        """Where a transfer to ``container_id`` goes; raise ``UnknownContainer``.

        Looked up by a minion whose own containers do not include the new owner."""
        check_container_id(container_id)
        with self._lock:
            info = self._containers.get(container_id)
            minion = self._minions.get(info.host) if info is not None else None
            alive = minion is not None and self._alive(minion, self._monotonic())
        if info is None or minion is None:
            raise UnknownContainer(f"no container is registered as {container_id!r} on any host")
        return Route(container_id, info.host, minion.rpc_address, alive)

    def list_containers(self, host: str = "") -> list[ContainerInfo]:
        """All containers, or those on ``host``, sorted by id."""
        if host:
            check_host(host)
        with self._lock:
            if host:
                ids = self._containers_by_host.get(host, set())
                found = [self._containers[c] for c in ids]
            else:
                found = list(self._containers.values())
        return sorted(found, key=lambda c: c.container_id)

    def lookup_object(self, key: str) -> ObjectInfo:
        """Return the directory entry for ``key``; raise ``ObjectNotFound``."""
        check_key(key)
        with self._lock:
            info = self._objects.get(key)
        if info is None:
            raise ObjectNotFound(f"no object with key {key!r} is in the directory")
        return info

    def list_objects(self, owner: str = "", host: str = "") -> list[ObjectInfo]:
        """Objects matching every given filter (empty: no filter), sorted by key."""
        if owner:
            check_owner(owner)
        if host:
            check_host(host)
        with self._lock:
            if host:
                candidates = [self._objects[k] for k in self._objects_by_host.get(host, set())]
            else:
                candidates = list(self._objects.values())
        found = [o for o in candidates if not owner or o.owner == owner]
        return sorted(found, key=lambda o: o.key)

    def list_minions(self) -> list[MinionInfo]:
        """Every minion heard from in this epoch, with liveness, sorted by host."""
        with self._lock:
            mono = self._monotonic()
            result = [
                MinionInfo(
                    host=m.host,
                    socket_path=m.socket_path,
                    rpc_address=m.rpc_address,
                    registered_at=m.registered_at,
                    last_heartbeat=m.last_heartbeat,
                    heartbeat_s=m.heartbeat_s,
                    alive=self._alive(m, mono),
                    containers=len(self._containers_by_host.get(m.host, ())),
                    objects=len(self._objects_by_host.get(m.host, ())),
                    keeps_objects=m.restarts.keeps_objects,
                    restarts=m.restarts.restarts,
                    kept_objects=m.restarts.kept_objects,
                )
                for m in self._minions.values()
            ]
        return sorted(result, key=lambda m: m.host)

    # -- helpers; the caller holds the lock -------------------------------------------------

    @staticmethod
    def _alive(minion: _Minion, monotonic_now: float) -> bool:
        return monotonic_now - minion.last_seen <= MISSED_HEARTBEATS * minion.heartbeat_s

    def _upsert_container(self, host: str, record: ContainerRecord, now: float) -> None:
        previous = self._containers.get(record.container_id)
        if previous is not None and previous.host != host:
            # The id moved to another host (the old one never said goodbye): last report wins.
            self._containers_by_host[previous.host].discard(record.container_id)
        self._containers[record.container_id] = ContainerInfo(
            container_id=record.container_id,
            host=host,
            pid=record.pid,
            uid=record.uid,
            registered_at=record.registered_at or now,
        )
        self._containers_by_host.setdefault(host, set()).add(record.container_id)

    def _remove_container(self, host: str, container_id: str) -> None:
        current = self._containers.get(container_id)
        # Only the host that holds the container may drop it: a late goodbye from a former
        # host must not erase the registration on the new one.
        if current is not None and current.host == host:
            del self._containers[container_id]
            self._containers_by_host[host].discard(container_id)

    def _upsert_object(self, host: str, record: ObjectRecord, now: float) -> None:
        previous = self._objects.get(record.key)
        if previous is not None and previous.host != host:
            # The object's home moved (cross-host transfer), which carries its generation on:
            # a report from the former home that was still lingering is older, and ignored.
            if record.generation < previous.generation:
                return
            self._objects_by_host[previous.host].discard(record.key)
        created_at = record.created_at or (previous.created_at if previous else now)
        self._objects[record.key] = ObjectInfo(
            key=record.key,
            host=host,
            size=record.size,
            owner=record.owner,
            generation=record.generation,
            created_at=created_at,
            updated_at=record.updated_at or now,
        )
        self._objects_by_host.setdefault(host, set()).add(record.key)

    def _remove_object(self, host: str, key: str) -> None:
        current = self._objects.get(key)
        # As for containers: the source host's removal after a move must not drop the new home.
        if current is not None and current.host == host:
            del self._objects[key]
            self._objects_by_host[host].discard(key)
