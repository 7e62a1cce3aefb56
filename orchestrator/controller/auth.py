"""Who is asking: API keys in ``Authorization: Bearer <key>``, and the role each route needs.

Every route under ``/api`` but ``/api/healthz`` needs a key (``api.main`` mounts the routers
behind ``require(Role.VIEWER)``); routes that change state ask for more with ``Operator`` or
``Admin`` parameters, which also tell the route who asked (``Principal``). ``/api/readyz``
answers anonymous callers too, with less (``MaybeKeyed``).

A key is looked up by its SHA-256 digest (``orchestrator.apikeys``) on the API's event loop
and remembered for ``KEY_TTL_S``. *Why a cache:* every request needs its key, and a load
test's users send thousands a minute with the same few keys; a lookup each time would be a
Postgres round trip on every request. *Cost:* a key revoked through another API process is
still accepted by this one for up to ``KEY_TTL_S`` (the process that revoked it forgets it at
once).
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Final

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from orchestrator.apikeys import KEY_RE, Role, hash_key
from orchestrator.controller.api.deps import run_store
from orchestrator.controller.ttl_cache import TtlCache
from orchestrator.errors import Forbidden, Unauthenticated

__all__ = [
    "KEY_TTL_S",
    "Admin",
    "KeyCache",
    "MaybeKeyed",
    "Operator",
    "Principal",
    "Viewer",
    "require",
    "require_viewer",
]

KEY_TTL_S: Final = 5.0
_ENTRIES: Final = 1024

_bearer = HTTPBearer(
    auto_error=False,
    scheme_name="ApiKey",
    description="An API key: `Authorization: Bearer <key>`. `cdiflow up` writes an admin key "
    "to <data>/api-key; admins issue more with POST /api/keys.",
)


@dataclass(frozen=True)
class Principal:
    """The key a request came with: its id, its name and its role."""

    key_id: uuid.UUID
    name: str
    role: Role


class KeyCache(TtlCache[Principal]):
    """Keys found recently, by digest, each for ``KEY_TTL_S``. Thread-safe: the event loop
    reads it, a route in a worker thread clears it after a revocation."""

    def __init__(self, ttl: float = KEY_TTL_S, entries: int = _ENTRIES) -> None:
        super().__init__(entries, ttl)


async def authenticate(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    """The request's ``Principal``; ``Unauthenticated`` without a known key."""
    if credentials is None:
        raise Unauthenticated(
            "this API needs a key: send it as 'Authorization: Bearer <key>' (`cdiflow up` "
            "keeps an admin key in <data>/api-key; `cdiflow status --json` shows it)"
        )
    key = credentials.credentials
    if not KEY_RE.fullmatch(key):
        raise Unauthenticated("the bearer token is not an API key; check what was sent")
    digest = hash_key(key)
    cache: KeyCache = request.app.state.key_cache
    principal = cache.get(digest)
    if principal is None:
        row = await run_store(request).api_key(digest)
        if row is None:
            raise Unauthenticated("this API key is not valid (revoked, or mistyped)")
        principal = Principal(row.id, row.name, Role(row.role))
        cache.put(digest, principal)
    return principal


async def authenticate_if_keyed(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal | None:
    """The request's ``Principal`` if it sends a key (which must then be valid, as anywhere
    else); ``None`` for an anonymous request. For the one route that answers both."""
    if credentials is None:
        return None
    return await authenticate(request, credentials)


def require(role: Role) -> Callable[..., Awaitable[Principal]]:
    """A dependency that lets through keys whose role allows what ``role`` may do."""

    async def check(principal: Annotated[Principal, Depends(authenticate)]) -> Principal:
        if not principal.role.allows(role):
            raise Forbidden(
                f"key {principal.name!r} has the role {principal.role.value}, which may not do "
                f"this; it needs the role {role.value} (ask an admin for such a key)"
            )
        return principal

    return check


require_viewer = require(Role.VIEWER)  # what ``api.main`` puts in front of every router
Viewer = Annotated[Principal, Depends(require_viewer)]
Operator = Annotated[Principal, Depends(require(Role.OPERATOR))]
Admin = Annotated[Principal, Depends(require(Role.ADMIN))]
MaybeKeyed = Annotated[Principal | None, Depends(authenticate_if_keyed)]
