"""Conversions between the ``cdi.v1`` wire messages and the plain models, both directions.

Each model (``models.py``) has exactly its message's fields, by name and meaning, so one
function converts any of them: the model's fields are the message's keyword arguments, and
the message's fields (its descriptor's) are the model's. *Why not ``json_format.MessageToDict``
and ``ParseDict``:* the JSON mapping turns 64-bit integers into strings and leaves out fields
at their defaults, so every model would need a second conversion back; reading the fields by
name needs none. ``tests/cdi/test_controller_convert.py`` holds each pair to the same fields.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, Final, TypeVar

from google.protobuf.message import Message

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

__all__ = ["MAX_MESSAGE_BYTES", "WIRE", "changes_from_pb", "changes_to_pb", "from_pb", "to_pb"]

# A RegisterMinion snapshot or a ListObjects answer for a busy host outgrows gRPC's 4 MiB default;
# client and server both raise their limits to this.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024

Model = ContainerRecord | ObjectRecord | ContainerInfo | ObjectInfo | Route | MinionInfo
M = TypeVar("M", ContainerRecord, ObjectRecord, ContainerInfo, ObjectInfo, Route, MinionInfo)
P = TypeVar("P", bound=Message)

WIRE: Final[dict[type[Any], type[Message]]] = {
    ContainerRecord: pb.ContainerRecord,
    ObjectRecord: pb.ObjectRecord,
    ContainerInfo: pb.ContainerInfo,
    ObjectInfo: pb.ObjectInfo,
    Route: pb.Route,
    MinionInfo: pb.MinionInfo,
}
"""Each model and the message that carries it."""


def to_pb(model: Model, message: type[P]) -> P:
    """Model → wire: ``message`` (``WIRE[type(model)]``) with the model's fields."""
    return message(**{f.name: getattr(model, f.name) for f in fields(model)})


def from_pb(message: Message, model: type[M]) -> M:
    """Wire → model: every field of ``message`` (a message of ``WIRE[model]``)."""
    return model(**{f.name: getattr(message, f.name) for f in message.DESCRIPTOR.fields})


def changes_to_pb(host: str, epoch: str, changes: Changes) -> pb.ReportChangesRequest:
    """Build the ReportChanges request for one batch."""
    return pb.ReportChangesRequest(
        host=host,
        epoch=epoch,
        upsert_containers=[to_pb(c, pb.ContainerRecord) for c in changes.upsert_containers],
        removed_containers=list(changes.removed_containers),
        upsert_objects=[to_pb(o, pb.ObjectRecord) for o in changes.upsert_objects],
        removed_objects=list(changes.removed_objects),
    )


def changes_from_pb(msg: pb.ReportChangesRequest) -> Changes:
    """Extract the batch from a ReportChanges request."""
    return Changes(
        upsert_containers=[from_pb(c, ContainerRecord) for c in msg.upsert_containers],
        removed_containers=list(msg.removed_containers),
        upsert_objects=[from_pb(o, ObjectRecord) for o in msg.upsert_objects],
        removed_objects=list(msg.removed_objects),
    )
