"""``/api/keys``: issue, list and revoke API keys (admin); ``/api/whoami``: the caller's key."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Request, Response

from orchestrator.controller.api.deps import SessionDep
from orchestrator.controller.auth import Admin, KeyCache, Viewer
from orchestrator.controller.strict_json import StrictJsonRoute
from orchestrator.db import repository as repo
from orchestrator.schemas import (
    IdentityPublic,
    KeyCreate,
    KeyCreated,
    KeyPublic,
    error_responses,
)

router = APIRouter(tags=["keys"], route_class=StrictJsonRoute)


@router.get("/whoami")
def whoami(principal: Viewer) -> IdentityPublic:
    """The key this request was made with: its name and role."""
    return IdentityPublic(id=principal.key_id, name=principal.name, role=principal.role)


@router.post("/keys", status_code=201, responses=error_responses(409))
def create_key(
    body: KeyCreate, session: SessionDep, principal: Admin, response: Response
) -> KeyCreated:
    """Issue a key; the answer holds the key itself, which is not shown again. 409 if the
    name is taken."""
    row, key = repo.create_api_key(session, body.name, body.role, created_by=principal.name)
    session.commit()
    response.headers["Location"] = f"/api/keys/{row.id}"
    return KeyCreated(**KeyPublic.model_validate(row).model_dump(), key=key)


@router.get("/keys")
def list_keys(session: SessionDep, principal: Admin) -> list[KeyPublic]:
    """Every key, by name (never the keys themselves: the API keeps only digests)."""
    return [KeyPublic.model_validate(r) for r in repo.list_api_keys(session)]


@router.delete("/keys/{key_id}", status_code=204, responses=error_responses(404, 409))
def revoke_key(key_id: uuid.UUID, session: SessionDep, principal: Admin, request: Request) -> None:
    """Revoke a key: refused from now on by this API process, and by the others within
    seconds. 409 for the configured admin key (change its setting instead)."""
    repo.delete_api_key(session, key_id)
    session.commit()
    cache: KeyCache = request.app.state.key_cache
    cache.clear()
