"""Container Data Items: shared-memory objects with exactly one owning container at a time.

The public API::

    import cdi
    client = cdi.connect("unix:///run/cdi/minion.sock", container_id="scheduler")
    obj = client.create("image-1", 1_000_000)
    obj.access()[:4] = b"data"
    obj.transfer("worker-1")

Errors are the tree in ``cdi.errors``; the paper's return codes are in ``cdi.codes``. Pub/sub
topics and bidirectional streams between containers are in ``cdi.channels``.
"""

from cdi.client import CDIObject, Client, connect
from cdi.errors import (
    AccessDenied,
    AccessTimeout,
    BufferInUse,
    CDIError,
    ChannelBroken,
    ChannelClosed,
    ChannelError,
    ChannelFull,
    ConfigError,
    ConnectionFailed,
    ContainerError,
    ContainerExists,
    ControllerUnavailable,
    InvalidArgument,
    KeyExists,
    MinionUnavailable,
    NameNotAllowed,
    NotAuthenticated,
    NotOwner,
    NotRegistered,
    ObjectError,
    ObjectNotFound,
    ObjectShared,
    OutOfMemory,
    ProtocolError,
    TransferFailed,
    UnknownContainer,
)
from cdi.keys import ObjectKey
from cdi.protocol import Isolation

__all__ = [
    "AccessDenied",
    "AccessTimeout",
    "BufferInUse",
    "CDIError",
    "CDIObject",
    "ChannelBroken",
    "ChannelClosed",
    "ChannelError",
    "ChannelFull",
    "Client",
    "ConfigError",
    "ConnectionFailed",
    "ContainerError",
    "ContainerExists",
    "ControllerUnavailable",
    "InvalidArgument",
    "Isolation",
    "KeyExists",
    "MinionUnavailable",
    "NameNotAllowed",
    "NotAuthenticated",
    "NotOwner",
    "NotRegistered",
    "ObjectError",
    "ObjectKey",
    "ObjectNotFound",
    "ObjectShared",
    "OutOfMemory",
    "ProtocolError",
    "TransferFailed",
    "UnknownContainer",
    "connect",
]
