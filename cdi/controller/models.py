"""Plain values the controller stores, reports and answers with (no gRPC types leak out)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "Changes",
    "ContainerInfo",
    "ContainerRecord",
    "MinionInfo",
    "ObjectInfo",
    "ObjectRecord",
    "Restarts",
    "Route",
]


@dataclass(frozen=True, slots=True)
class ContainerRecord:
    """A container as its minion reports it; ``registered_at`` 0 means "stamp it on arrival"."""

    container_id: str
    pid: int
    uid: int
    registered_at: float = 0.0


@dataclass(frozen=True, slots=True)
class ObjectRecord:
    """An object as its home minion reports it; an empty ``owner`` means nobody owns it."""

    key: str
    size: int
    owner: str
    generation: int
    created_at: float = 0.0
    updated_at: float = 0.0


@dataclass(frozen=True, slots=True)
class Restarts:
    """What a minion keeps across its restarts, as it announces it (docs/minion-restart.md):
    whether it has a state folder, how many minions took its objects over from another since
    they began (itself included), and the objects it found again when it started."""

    keeps_objects: bool = False
    restarts: int = 0
    kept_objects: int = 0


@dataclass(frozen=True, slots=True)
class Changes:
    """One minion's batch of changes since its last report."""

    upsert_containers: Sequence[ContainerRecord] = ()
    removed_containers: Sequence[str] = ()
    upsert_objects: Sequence[ObjectRecord] = ()
    removed_objects: Sequence[str] = ()

    def __bool__(self) -> bool:
        return bool(
            self.upsert_containers
            or self.removed_containers
            or self.upsert_objects
            or self.removed_objects
        )


@dataclass(frozen=True, slots=True)
class ContainerInfo:
    """A registered container and the host whose minion it talks to."""

    container_id: str
    host: str
    pid: int
    uid: int
    registered_at: float


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """A directory entry: where an object's memory lives and who owns it."""

    key: str
    host: str
    size: int
    owner: str
    generation: int
    created_at: float
    updated_at: float


@dataclass(frozen=True, slots=True)
class Route:
    """Where a container lives: its host and the transfer address of that host's minion."""

    container_id: str
    host: str
    rpc_address: str
    alive: bool


@dataclass(frozen=True, slots=True)
class MinionInfo:
    """A minion the controller has heard from; ``alive`` is false after 3 missed heartbeats."""

    host: str
    socket_path: str
    rpc_address: str
    registered_at: float
    last_heartbeat: float
    heartbeat_s: float
    alive: bool
    containers: int = 0
    objects: int = 0
    keeps_objects: bool = False  # a state folder: its objects outlive its process
    restarts: int = 0  # minions that took its objects over from another (docs/minion-restart.md)
    kept_objects: int = 0  # objects the latest of them found again at its start
