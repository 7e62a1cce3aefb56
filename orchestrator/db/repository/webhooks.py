"""Webhooks as the API sees them: register, list, read, delete, and their delivery log.

Functions take the caller's ``Session`` and never commit: the caller owns the transaction.
A webhook's secret is returned by ``create_webhook`` alone: the routes never show it again.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from orchestrator.contract.vocabulary import DeliveryStatus
from orchestrator.db.models import Webhook, WebhookDelivery
from orchestrator.errors import Conflict, NotFound

__all__ = ["create_webhook", "delete_webhook", "get_webhook", "list_deliveries", "list_webhooks"]


def create_webhook(
    session: Session,
    name: str,
    url: str,
    events: Sequence[str],
    secret: str,
    *,
    definition: str | None,
    created_by: str | None,
) -> Webhook:
    """Register a webhook; ``Conflict`` if the name is taken."""
    row: Webhook | None = session.scalar(
        insert(Webhook)
        .values(
            id=uuid.uuid4(),
            name=name,
            url=url,
            events=list(events),
            secret=secret,
            definition=definition,
            created_by=created_by,
        )
        .on_conflict_do_nothing(index_elements=[Webhook.name])
        .returning(Webhook)
    )
    if row is None:
        raise Conflict(f"a webhook named {name!r} exists already; delete it first or pick another")
    return row


def list_webhooks(session: Session) -> list[Webhook]:
    return list(session.scalars(select(Webhook).order_by(Webhook.name)))


def get_webhook(session: Session, name: str) -> Webhook:
    found = session.scalar(select(Webhook).where(Webhook.name == name))
    if found is None:
        names = list(session.scalars(select(Webhook.name).order_by(Webhook.name).limit(50)))
        raise NotFound("webhook", name, known=names)
    return found


def delete_webhook(session: Session, name: str) -> None:
    """Delete a webhook and its delivery log (what was not sent yet is not sent)."""
    session.delete(get_webhook(session, name))
    session.flush()


def list_deliveries(
    session: Session,
    name: str,
    *,
    status: DeliveryStatus | None = None,
    limit: int = 50,
    offset: int = 0,
) -> tuple[list[WebhookDelivery], int]:
    """One page of a webhook's deliveries, newest first, and how many match."""
    hook = get_webhook(session, name)
    where = [WebhookDelivery.webhook_id == hook.id]
    if status is not None:
        where.append(WebhookDelivery.status == status)
    total = session.scalar(select(func.count()).select_from(WebhookDelivery).where(*where)) or 0
    page = session.scalars(
        select(WebhookDelivery)
        .where(*where)
        .order_by(WebhookDelivery.id.desc())
        .limit(limit)
        .offset(offset)
    )
    return list(page), total
