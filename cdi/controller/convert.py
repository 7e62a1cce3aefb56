"""Conversions between the ``cdi.v1`` wire messages and the plain models, both directions."""

from __future__ import annotations

from cdi.controller.models import (
    Changes,
    ContainerInfo,
    ContainerRecord,
    MinionInfo,
    ObjectInfo,
    ObjectRecord,
    Route,
)
from cdi.proto import cdi_pb2 as pb

__all__ = [
    "MAX_MESSAGE_BYTES",
    "changes_from_pb",
    "changes_to_pb",
    "container_info_from_pb",
    "container_info_to_pb",
    "container_record_from_pb",
    "container_record_to_pb",
    "minion_info_from_pb",
    "minion_info_to_pb",
    "object_info_from_pb",
    "object_info_to_pb",
    "object_record_from_pb",
    "object_record_to_pb",
]

# A RegisterMinion snapshot or a ListObjects answer for a busy host outgrows gRPC's 4 MiB default;
# client and server both raise their limits to this.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024


def container_record_to_pb(record: ContainerRecord) -> pb.ContainerRecord:
    """Model → wire."""
    return pb.ContainerRecord(
        container_id=record.container_id,
        pid=record.pid,
        uid=record.uid,
        registered_at=record.registered_at,
    )


def container_record_from_pb(msg: pb.ContainerRecord) -> ContainerRecord:
    """Wire → model."""
    return ContainerRecord(
        container_id=msg.container_id, pid=msg.pid, uid=msg.uid, registered_at=msg.registered_at
    )


def object_record_to_pb(record: ObjectRecord) -> pb.ObjectRecord:
    """Model → wire."""
    return pb.ObjectRecord(
        key=record.key,
        size=record.size,
        owner=record.owner,
        generation=record.generation,
        created_at=record.created_at,
        updated_at=record.updated_at,
    )


def object_record_from_pb(msg: pb.ObjectRecord) -> ObjectRecord:
    """Wire → model."""
    return ObjectRecord(
        key=msg.key,
        size=msg.size,
        owner=msg.owner,
        generation=msg.generation,
        created_at=msg.created_at,
        updated_at=msg.updated_at,
    )


def changes_to_pb(host: str, epoch: str, changes: Changes) -> pb.ReportChangesRequest:
    """Build the ReportChanges request for one batch."""
    return pb.ReportChangesRequest(
        host=host,
        epoch=epoch,
        upsert_containers=[container_record_to_pb(c) for c in changes.upsert_containers],
        removed_containers=list(changes.removed_containers),
        upsert_objects=[object_record_to_pb(o) for o in changes.upsert_objects],
        removed_objects=list(changes.removed_objects),
    )


def changes_from_pb(msg: pb.ReportChangesRequest) -> Changes:
    """Extract the batch from a ReportChanges request."""
    return Changes(
        upsert_containers=[container_record_from_pb(c) for c in msg.upsert_containers],
        removed_containers=list(msg.removed_containers),
        upsert_objects=[object_record_from_pb(o) for o in msg.upsert_objects],
        removed_objects=list(msg.removed_objects),
    )


def container_info_to_pb(info: ContainerInfo) -> pb.ContainerInfo:
    """Model → wire."""
    return pb.ContainerInfo(
        container_id=info.container_id,
        host=info.host,
        pid=info.pid,
        uid=info.uid,
        registered_at=info.registered_at,
    )


def container_info_from_pb(msg: pb.ContainerInfo) -> ContainerInfo:
    """Wire → model."""
    return ContainerInfo(
        container_id=msg.container_id,
        host=msg.host,
        pid=msg.pid,
        uid=msg.uid,
        registered_at=msg.registered_at,
    )


def route_to_pb(route: Route) -> pb.Route:
    """Model → wire."""
    return pb.Route(
        container_id=route.container_id,
        host=route.host,
        rpc_address=route.rpc_address,
        alive=route.alive,
    )


def route_from_pb(msg: pb.Route) -> Route:
    """Wire → model."""
    return Route(
        container_id=msg.container_id, host=msg.host, rpc_address=msg.rpc_address, alive=msg.alive
    )


def object_info_to_pb(info: ObjectInfo) -> pb.ObjectInfo:
    """Model → wire."""
    return pb.ObjectInfo(
        key=info.key,
        host=info.host,
        size=info.size,
        owner=info.owner,
        generation=info.generation,
        created_at=info.created_at,
        updated_at=info.updated_at,
    )


def object_info_from_pb(msg: pb.ObjectInfo) -> ObjectInfo:
    """Wire → model."""
    return ObjectInfo(
        key=msg.key,
        host=msg.host,
        size=msg.size,
        owner=msg.owner,
        generation=msg.generation,
        created_at=msg.created_at,
        updated_at=msg.updated_at,
    )


def minion_info_to_pb(info: MinionInfo) -> pb.MinionInfo:
    """Model → wire."""
    return pb.MinionInfo(
        host=info.host,
        socket_path=info.socket_path,
        rpc_address=info.rpc_address,
        registered_at=info.registered_at,
        last_heartbeat=info.last_heartbeat,
        heartbeat_s=info.heartbeat_s,
        alive=info.alive,
        containers=info.containers,
        objects=info.objects,
    )


def minion_info_from_pb(msg: pb.MinionInfo) -> MinionInfo:
    """Wire → model."""
    return MinionInfo(
        host=msg.host,
        socket_path=msg.socket_path,
        rpc_address=msg.rpc_address,
        registered_at=msg.registered_at,
        last_heartbeat=msg.last_heartbeat,
        heartbeat_s=msg.heartbeat_s,
        alive=msg.alive,
        containers=msg.containers,
        objects=msg.objects,
    )
