"""Every error the CDI runtime raises, as one tree.

Nothing from ``socket``, ``grpc`` or ``mmap`` escapes the ``cdi`` package untranslated: callers
catch ``CDIError`` (or a branch of it) and get a message a person can act on.

    CDIError
    ├── ConfigError                 bad URL, option or environment value
    ├── InvalidArgument             bad key, size or container id        (also ValueError)
    ├── ConnectionFailed            cannot reach a CDI process           (also ConnectionError)
    │   ├── MinionUnavailable       no minion at the socket, or it went away
    │   └── ControllerUnavailable   the CDI controller does not answer
    ├── ProtocolError               a malformed or unexpected message
    ├── NotAuthenticated            no credential, or one this cluster did not issue
    │                                 (controller, gateway; also PermissionError)
    ├── AccessDenied                a credential whose role or host may not do this
    │                                 (also PermissionError)
    ├── NotRegistered               an operation before ``register``
    ├── ContainerError
    │   ├── UnknownContainer        a transfer to a container nobody registered
    │   ├── ContainerExists         a live container already uses that id
    │   └── NameNotAllowed          that id is reserved for another uid (also PermissionError)
    ├── ObjectError
    │   ├── KeyExists               ``create``/``copy`` onto a key that exists      (paper: 0)
    │   ├── ObjectNotFound          no object with that key (or it was destroyed)  (paper: 0)
    │   ├── NotOwner                the caller does not own the object  (also PermissionError)
    │   ├── ObjectShared            readers hold it: no write, transfer, resize or destroy yet
    │   └── BufferInUse             views of the data are still alive at transfer/destroy
    ├── OutOfMemory                 the minion cannot hold another object of that size (paper: -1)
    ├── AccessTimeout               ``access(timeout=)`` expired        (also TimeoutError)
    ├── ChannelError                a channel (``cdi.channels``) cannot go on
    │   ├── ChannelFull             a reader is a whole ring behind: ``publish`` may not wait
    │   │                             (policy ``fail``) or waited out its timeout
    │   │                             (also TimeoutError)
    │   ├── ChannelClosed           the other end closed the channel or is gone
    │   └── ChannelBroken           the link carrying a channel between hosts broke
    └── TransferFailed              a cross-host transfer did not happen; the caller still owns
                                    the object (``in_doubt``: the other host did not say)

Each class carries a stable ``code`` string, which is what travels on the wire between minion and
client; ``error_from_code`` turns it back into the class.
"""

from __future__ import annotations

__all__ = [
    "AccessDenied",
    "AccessTimeout",
    "BufferInUse",
    "CDIError",
    "ChannelBroken",
    "ChannelClosed",
    "ChannelError",
    "ChannelFull",
    "ConfigError",
    "ConnectionFailed",
    "ContainerError",
    "ContainerExists",
    "ControllerUnavailable",
    "InvalidArgument",
    "KeyExists",
    "MinionUnavailable",
    "NameNotAllowed",
    "NotAuthenticated",
    "NotOwner",
    "NotRegistered",
    "ObjectError",
    "ObjectNotFound",
    "ObjectShared",
    "OutOfMemory",
    "ProtocolError",
    "TransferFailed",
    "UnknownContainer",
    "error_from_code",
]


class CDIError(Exception):
    """Base of every error raised by the CDI runtime."""

    code = "cdi_error"


class ConfigError(CDIError):
    """A URL, option or environment value is not usable."""

    code = "config"


class InvalidArgument(CDIError, ValueError):
    """A key, size or container id is malformed or out of range."""

    code = "invalid_argument"


class ConnectionFailed(CDIError, ConnectionError):
    """A CDI process cannot be reached."""

    code = "connection_failed"


class MinionUnavailable(ConnectionFailed):
    """No minion listens at the configured socket, or it closed the connection."""

    code = "minion_unavailable"


class ControllerUnavailable(ConnectionFailed):
    """The CDI controller does not answer."""

    code = "controller_unavailable"


class ProtocolError(CDIError):
    """A message that does not follow the minion protocol."""

    code = "protocol"


class NotAuthenticated(CDIError, PermissionError):
    """The CDI controller or another host's gateway wants a credential of this cluster and got
    none, or one it did not issue (``cdi.auth``)."""

    code = "unauthenticated"


class AccessDenied(CDIError, PermissionError):
    """A credential of this cluster, but of a role (or a host) that may not do this."""

    code = "access_denied"


class NotRegistered(CDIError):
    """An object operation was attempted before ``register(container_id)``."""

    code = "not_registered"


class ContainerError(CDIError):
    """A problem with a container id."""

    code = "container"


class UnknownContainer(ContainerError):
    """No live container is registered under that id."""

    code = "unknown_container"


class ContainerExists(ContainerError):
    """A live container is already registered under that id."""

    code = "container_exists"


class NameNotAllowed(ContainerError, PermissionError):
    """The minion's configuration reserves that container id for another uid (``--names``)."""

    code = "name_not_allowed"


class ObjectError(CDIError):
    """A problem with one CDI object."""

    code = "object"


class KeyExists(ObjectError):
    """An object with that key already exists (the paper's return code 0 for create/copy)."""

    code = "key_exists"


class ObjectNotFound(ObjectError):
    """No object has that key, or it was destroyed (the paper's return code 0 for use)."""

    code = "not_found"


class NotOwner(ObjectError, PermissionError):
    """Only the owner may read, write, copy, transfer, resize or destroy an object."""

    code = "not_owner"


class ObjectShared(ObjectError):
    """Readers hold a share of the object: nobody writes, transfers, resizes or destroys it
    until every reader has released it (``access(timeout=)`` waits for that)."""

    code = "shared"


class BufferInUse(ObjectError):
    """Views of the object's memory are still referenced, so it cannot be unmapped yet."""

    code = "buffer_in_use"


class OutOfMemory(CDIError):
    """The minion cannot hold another object of that size (the paper's return code -1)."""

    code = "out_of_memory"


class AccessTimeout(CDIError, TimeoutError):
    """``access(timeout=...)`` expired before ownership arrived."""

    code = "access_timeout"


class ChannelError(CDIError):
    """A channel (``cdi.channels``) cannot go on: its ring is not one, or a reader fell a
    whole ring behind the writer."""

    code = "channel"


class ChannelFull(ChannelError, TimeoutError):
    """A reader has not yet read the message a ``publish`` would overwrite: the writer may not
    wait (back-pressure policy ``fail``), or waited as long as its ``timeout`` allowed."""

    code = "channel_full"


class ChannelClosed(ChannelError):
    """The other end closed the channel, or its process is gone: nothing more will come."""

    code = "channel_closed"


class ChannelBroken(ChannelError):
    """The link that carried a channel between two hosts broke (a host's gateway went away, or
    nothing crossed for the link timeout): messages not received by then are lost."""

    code = "channel_broken"


class TransferFailed(CDIError):
    """A transfer to a container on another host did not happen.

    The object is back with the caller, intact, unless the message says the outcome is in
    doubt: then the other host took the bytes but did not answer, and this host's gateway holds
    the object until it does (it comes back to the caller if the other host did not keep it)."""

    code = "transfer_failed"

    def __init__(self, message: str, *, in_doubt: bool = False, xfer: str = "") -> None:
        super().__init__(message)
        self.in_doubt = in_doubt
        self.xfer = xfer


_BY_CODE: dict[str, type[CDIError]] = {
    cls.code: cls
    for cls in (
        CDIError,
        ConfigError,
        InvalidArgument,
        ConnectionFailed,
        MinionUnavailable,
        ControllerUnavailable,
        ProtocolError,
        NotAuthenticated,
        AccessDenied,
        NotRegistered,
        ContainerError,
        UnknownContainer,
        ContainerExists,
        NameNotAllowed,
        ObjectError,
        KeyExists,
        ObjectNotFound,
        NotOwner,
        ObjectShared,
        BufferInUse,
        OutOfMemory,
        AccessTimeout,
        ChannelError,
        ChannelFull,
        ChannelClosed,
        ChannelBroken,
        TransferFailed,
    )
}


def error_from_code(code: str, message: str) -> CDIError:
    """Rebuild the exception a minion reported as ``code``; unknown codes become ``CDIError``."""
    return _BY_CODE.get(code, CDIError)(message)
