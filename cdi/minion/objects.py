"""What a minion knows about its containers and objects."""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from cdi.minion.segments import Segment
from cdi.protocol import Isolation

__all__ = ["Connection", "StoredObject", "Waiter"]


@dataclass(eq=False)
class Connection:
    """One client socket; at most one container registers through it."""

    sock: socket.socket
    pid: int
    uid: int
    gid: int
    container: str | None = None
    waiting: dict[int, str] = field(default_factory=dict)
    """Deferred ``access`` requests: request id -> key."""
    have: dict[int, int] = field(default_factory=dict)
    """Deferred ``access`` requests whose caller still maps a segment: request id -> its id."""
    pidfd: int | None = None
    """The registered process (SO_PEERPIDFD): its exit ends the connection even while a child
    it forked without exec keeps the socket open."""
    doomed: bool = False
    """A send to it failed (or it is closed): it gets nothing more and is closed, with its
    objects recovered, once the request in hand is answered."""


class Waiter(NamedTuple):
    """A deferred request: an ``access`` (waits to own the object alone) or a ``read`` (waits
    until the caller may read it)."""

    conn: Connection
    request_id: int
    read: bool


@dataclass(eq=False)
class StoredObject:
    """One CDI object: its memory, who owns it, and who gets it back if the owner dies."""

    key: str
    size: int
    segment: Segment
    owner: str
    creator: str
    recovery: str
    isolation: Isolation
    generation: int = 1
    uids: set[int] = field(default_factory=set)
    """Uids of every container that created, owned or was granted a share of the object:
    besides the minion's own uid and root, only they see it in ``use`` and ``list``."""
    readers: list[str] = field(default_factory=list)
    """Containers holding a read share, in the order granted: while any does, nobody writes,
    transfers, resizes or destroys the object."""
    live: bool = False
    """A live share (a channel's ring): its owner goes on writing while readers hold it."""
    created_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)

    @property
    def shared(self) -> bool:
        return bool(self.readers)

    @property
    def writable_by_owner(self) -> bool:
        """Whether its owner may write it now: nobody reads it, or its share is live."""
        return not self.readers or self.live

    def readable_by(self, container: str | None) -> bool:
        """Whether ``container`` may read the object now: its owner, or a reader of a share."""
        return container == self.owner or container in self.readers

    def touch(self) -> None:
        self.updated_at = time.time()

    def grant_fields(self) -> dict[str, Any]:
        return {
            "size": self.size,
            "capacity": self.segment.capacity,
            "generation": self.generation,
            "isolation": self.isolation.value,
            "segment": self.segment.id,
        }

    def grant_fd(self, have: object) -> int | None:
        """The fd to send with a grant: none if the caller still maps this very segment (it
        says so in ``have``). Strict objects always send it, as before caching existed."""
        if (
            type(have) is int
            and have == self.segment.id
            and self.isolation is Isolation.COOPERATIVE
        ):
            return None
        return self.segment.fd

    def describe(self, host: str) -> dict[str, Any]:
        return {
            "key": self.key,
            "size": self.size,
            "capacity": self.segment.capacity,
            "owner": self.owner,
            "creator": self.creator,
            "recovery": self.recovery,
            "isolation": str(self.isolation),
            "generation": self.generation,
            "host": host,
            "readers": list(self.readers),
            "segment": self.segment.id,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
        }
