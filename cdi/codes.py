"""The paper's return-code API (1 success / 0 exists-or-missing / -1 other failure).

For callers that port code written against the paper's C-style interface::

    rc, obj = codes.create(client, "frame-1", 2_000_000)   # 1, 0 (key exists) or -1
    rc = codes.transfer(obj, "detector-1")                 # 1 or -1

The Pythonic API (exceptions) is in ``cdi.client``; these wrappers only translate its errors.
"""

from __future__ import annotations

from cdi.client import CDIObject, Client
from cdi.errors import CDIError, KeyExists, ObjectNotFound

__all__ = ["access", "copy", "create", "destroy", "register", "transfer", "use"]

OK, EXISTS_OR_MISSING, FAILED = 1, 0, -1


def register(client: Client, container_id: str | int) -> int:
    try:
        client.register(container_id)
    except CDIError:
        return FAILED
    return OK


def create(client: Client, key: str, size: int) -> tuple[int, CDIObject | None]:
    """1 and the object; 0 if ``key`` exists; -1 for any other reason (e.g. no memory)."""
    try:
        return OK, client.create(key, size)
    except KeyExists:
        return EXISTS_OR_MISSING, None
    except CDIError:
        return FAILED, None


def use(client: Client, key: str) -> tuple[int, CDIObject | None]:
    """1 and a handle; 0 if no object has ``key``."""
    try:
        return OK, client.use(key)
    except ObjectNotFound:
        return EXISTS_OR_MISSING, None
    except CDIError:
        return FAILED, None


def copy(obj: CDIObject, key: str) -> tuple[int, CDIObject | None]:
    """1 and the copy; 0 if ``key`` exists; -1 otherwise (not the owner, no memory, ...)."""
    try:
        return OK, obj.copy(key)
    except KeyExists:
        return EXISTS_OR_MISSING, None
    except CDIError:
        return FAILED, None


def access(obj: CDIObject, timeout: float | None = None) -> int:
    """Block until owned: 1; -1 on timeout or error."""
    try:
        obj.access(timeout).release()
    except CDIError:
        return FAILED
    return OK


def transfer(obj: CDIObject, container_id: str | int) -> int:
    try:
        obj.transfer(container_id)
    except CDIError:
        return FAILED
    return OK


def destroy(obj: CDIObject) -> int:
    try:
        obj.destroy()
    except CDIError:
        return FAILED
    return OK
