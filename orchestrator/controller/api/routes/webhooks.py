"""``/api/webhooks``: where runs' (and steps') ends are POSTed, signed; admins only (a webhook
sends data to an address of its registrant's choosing)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response

from orchestrator.contract.vocabulary import DeliveryStatus
from orchestrator.controller.api.deps import SessionDep
from orchestrator.controller.api.params import MAX_OFFSET, ResourceName
from orchestrator.controller.auth import Admin
from orchestrator.controller.strict_json import StrictJsonRoute
from orchestrator.db import repository as repo
from orchestrator.notify.signing import new_secret
from orchestrator.schemas import (
    DeliveryPage,
    DeliveryPublic,
    WebhookCreate,
    WebhookCreated,
    WebhookPublic,
    error_responses,
)

router = APIRouter(prefix="/webhooks", tags=["webhooks"], route_class=StrictJsonRoute)


@router.post("", status_code=201, responses=error_responses(409, 422))
def create_webhook(
    body: WebhookCreate, session: SessionDep, response: Response, principal: Admin
) -> WebhookCreated:
    """Register a webhook. The answer holds its signing secret, which is not shown again:
    every delivery carries ``webhook-id``, ``webhook-timestamp`` and ``webhook-signature``
    (Standard Webhooks: HMAC-SHA256 of ``<id>.<timestamp>.<body>``). 409 if the name is
    taken."""
    secret = body.checked_secret() or new_secret()
    row = repo.create_webhook(
        session,
        body.name,
        body.url,
        [e.value for e in body.events],
        secret,
        definition=body.workflow,
        created_by=principal.name,
    )
    session.commit()
    response.headers["Location"] = f"/api/webhooks/{row.name}"
    return WebhookCreated(**WebhookPublic.model_validate(row).model_dump(), secret=secret)


@router.get("")
def list_webhooks(session: SessionDep, principal: Admin) -> list[WebhookPublic]:
    """Every webhook, by name (never their secrets)."""
    return [WebhookPublic.model_validate(r) for r in repo.list_webhooks(session)]


@router.get("/{name}", responses=error_responses(404))
def get_webhook(name: ResourceName, session: SessionDep, principal: Admin) -> WebhookPublic:
    return WebhookPublic.model_validate(repo.get_webhook(session, name))


@router.delete("/{name}", status_code=204, responses=error_responses(404))
def delete_webhook(name: ResourceName, session: SessionDep, principal: Admin) -> None:
    """Delete a webhook and its delivery log; what it had not sent yet is not sent."""
    repo.delete_webhook(session, name)
    session.commit()


@router.get("/{name}/deliveries", responses=error_responses(404))
def list_deliveries(
    name: ResourceName,
    session: SessionDep,
    principal: Admin,
    status: DeliveryStatus | None = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
) -> DeliveryPage:
    """The webhook's deliveries, newest first: each one's attempts, the receiver's last
    answer, when it is tried again."""
    rows, total = repo.list_deliveries(session, name, status=status, limit=limit, offset=offset)
    items = [DeliveryPublic.model_validate(r) for r in rows]
    return DeliveryPage(items=items, total=total, limit=limit, offset=offset)
