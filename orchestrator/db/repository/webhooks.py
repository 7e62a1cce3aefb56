"""Webhooks as the API sees them: register, list, read, delete, and their delivery log.

Functions take the caller's ``Session`` and never commit: the caller owns the transaction.
A webhook's secret is returned by ``create_webhook`` alone: the routes never show it again.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from orchestrator.contract.vocabulary import DeliveryStatus
from orchestrator.db.models import Webhook, WebhookDelivery
from orchestrator.db.repository.paging import capped_count
from orchestrator.errors import Conflict, NotFound

__all__ = [
    "DeliveryList",
    "create_webhook",
    "delete_webhook",
    "get_webhook",
    "list_deliveries",
    "list_webhooks",
]


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


@dataclass(frozen=True)
class DeliveryList:
    """One page of a webhook's deliveries, newest first; ``more``: older ones follow."""

    items: list[WebhookDelivery]
    more: bool
    total: int
    total_exact: bool  # False: at least ``total`` (counted up to ``paging.COUNT_CAP``)


def list_deliveries(
    session: Session,
    name: str,
    *,
    status: DeliveryStatus | None = None,
    limit: int = 50,
    before_id: int | None = None,
    offset: int = 0,
) -> DeliveryList:
    """One page of a webhook's deliveries, newest first, from ``before_id`` (the last id of
    the page before; none: the first page), and how many match. A page reads its own rows
    (``ix_webhook_deliveries_webhook_id_id``, ``..._webhook_id_status_id``) however long the
    log; the count stops at ``paging.COUNT_CAP``."""
    hook = get_webhook(session, name)
    where = [WebhookDelivery.webhook_id == hook.id]
    if status is not None:
        where.append(WebhookDelivery.status == status)
    total, exact = capped_count(session, select(WebhookDelivery.id).where(*where))
    if before_id is not None:
        where.append(WebhookDelivery.id < before_id)
    rows = list(
        session.scalars(
            select(WebhookDelivery)
            .where(*where)
            .order_by(WebhookDelivery.id.desc())
            .limit(limit + 1)
            .offset(offset)
        )
    )
    return DeliveryList(rows[:limit], len(rows) > limit, total, exact)
