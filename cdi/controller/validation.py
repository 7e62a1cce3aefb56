"""Input checks shared by the controller (authoritative) and the reporter (fail early, locally)."""

from __future__ import annotations

import math

from cdi.controller.models import ContainerRecord, ObjectRecord, Restarts
from cdi.errors import InvalidArgument

__all__ = [
    "MAX_NAME_LENGTH",
    "MAX_PATH_LENGTH",
    "check_container_id",
    "check_container_record",
    "check_host",
    "check_interval",
    "check_key",
    "check_name",
    "check_object_record",
    "check_owner",
    "check_restarts",
    "check_rpc_address",
    "check_socket_path",
    "check_timestamp",
    "check_uint",
]

MAX_NAME_LENGTH = 256
MAX_PATH_LENGTH = 4096


def check_name(value: object, what: str) -> str:
    """Return ``value`` if it is a usable name: non-empty, <= 256 chars, no whitespace or NUL."""
    if not isinstance(value, str):
        raise InvalidArgument(f"{what} must be a string, not {type(value).__name__}")
    if not value:
        raise InvalidArgument(f"{what} must not be empty")
    if len(value) > MAX_NAME_LENGTH:
        raise InvalidArgument(
            f"{what} is {len(value)} characters long; at most {MAX_NAME_LENGTH} are allowed"
        )
    if any(ch.isspace() or ch == "\0" for ch in value):
        raise InvalidArgument(f"{what} {value!r} must not contain whitespace or NUL characters")
    return value


def check_container_id(value: object) -> str:
    """Validate a container id."""
    return check_name(value, "container id")


def check_key(value: object) -> str:
    """Validate an object key."""
    return check_name(value, "object key")


def check_host(value: object) -> str:
    """Validate a minion host name."""
    return check_name(value, "host name")


def check_uint(value: object, what: str, bits: int) -> int:
    """Return ``value`` if it is an int that fits the unsigned ``bits``-wide wire field."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{what} must be an integer, not {type(value).__name__}")
    if not 0 <= value < 1 << bits:
        raise InvalidArgument(f"{what} must be between 0 and {(1 << bits) - 1}, not {value}")
    return value


def check_interval(value: object, what: str) -> float:
    """Return ``value`` as a float if it is a finite, positive number of seconds."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgument(f"{what} must be a number of seconds, not {type(value).__name__}")
    seconds = float(value)
    if not math.isfinite(seconds) or seconds <= 0:
        raise InvalidArgument(f"{what} must be a positive number of seconds, not {value}")
    return seconds


def check_timestamp(value: object, what: str) -> float:
    """Return ``value`` as a float if it is a finite, non-negative Unix time (0: unknown)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgument(f"{what} must be a Unix time in seconds, not {type(value).__name__}")
    seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0:
        raise InvalidArgument(f"{what} must be a non-negative Unix time, not {value}")
    return seconds


def check_owner(value: object) -> str:
    """Validate an object's owner: a container id, or empty while nobody owns the object."""
    return "" if value == "" else check_name(value, "owner container id")


def check_container_record(record: ContainerRecord) -> ContainerRecord:
    """Validate every field of a reported container."""
    check_container_id(record.container_id)
    check_uint(record.pid, f"pid of container {record.container_id!r}", 32)
    check_uint(record.uid, f"uid of container {record.container_id!r}", 32)
    check_timestamp(record.registered_at, f"registered_at of container {record.container_id!r}")
    return record


def check_object_record(record: ObjectRecord) -> ObjectRecord:
    """Validate every field of a reported object."""
    check_key(record.key)
    check_uint(record.size, f"size of object {record.key!r}", 64)
    check_owner(record.owner)
    check_uint(record.generation, f"generation of object {record.key!r}", 64)
    check_timestamp(record.created_at, f"created_at of object {record.key!r}")
    check_timestamp(record.updated_at, f"updated_at of object {record.key!r}")
    return record


def check_restarts(restarts: Restarts) -> Restarts:
    """Validate what a minion says it keeps across restarts."""
    if not isinstance(restarts.keeps_objects, bool):
        raise InvalidArgument("keeps_objects must be a boolean")
    check_uint(restarts.restarts, "restarts", 32)
    check_uint(restarts.kept_objects, "kept_objects", 32)
    return restarts


def check_socket_path(value: object) -> str:
    """Validate a minion's Unix socket path (spaces are legal in paths; NUL is not)."""
    if not isinstance(value, str):
        raise InvalidArgument(f"socket path must be a string, not {type(value).__name__}")
    if not value:
        raise InvalidArgument("socket path must not be empty")
    if len(value) > MAX_PATH_LENGTH or "\0" in value:
        raise InvalidArgument(
            f"socket path must be at most {MAX_PATH_LENGTH} characters with no NUL character"
        )
    return value


def check_rpc_address(value: object) -> str:
    """Validate a minion's cross-host RPC address; empty means it serves none."""
    return "" if value == "" else check_name(value, "rpc address")
