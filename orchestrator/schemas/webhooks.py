"""Webhooks: what registers one, a webhook as listed, its secret shown once, its deliveries."""

from __future__ import annotations

import re
import uuid
from datetime import datetime
from typing import Any, Final
from urllib.parse import urlsplit

from pydantic import AliasChoices, BaseModel, Field, field_validator

from orchestrator.contract.vocabulary import DeliveryStatus, WebhookEvent
from orchestrator.errors import InvalidRequest
from orchestrator.notify.signing import SECRET_PATTERN, secret_problem
from orchestrator.schemas.base import NAME_RULE, RequestBody, ResponseBody, checked_name

__all__ = [
    "RUN_ENDS",
    "DeliveryPage",
    "DeliveryPublic",
    "WebhookCreate",
    "WebhookCreated",
    "WebhookPublic",
]

MAX_URL: Final = 2048
# A delivery's address, as the schema states it and the validator checks it: http or https, a
# host (name or IPv4 address; no user or password) and optionally a port, then any printable
# ASCII but spaces.
URL_PATTERN: Final = r"^https?://[A-Za-z0-9._~%!$&'()*+,;=-]+(?::[0-9]{1,5})?(?:[/?#][!-~]*)?$"
# What a webhook is told of when it names nothing: every end of a run.
RUN_ENDS: Final = (
    WebhookEvent.WORKFLOW_COMPLETED,
    WebhookEvent.WORKFLOW_FAILED,
    WebhookEvent.WORKFLOW_CANCELLED,
    WebhookEvent.WORKFLOW_TIMED_OUT,
)


class WebhookCreate(RequestBody):
    name: str = Field(examples=["ci-notify"], json_schema_extra=NAME_RULE)
    url: str = Field(
        max_length=MAX_URL,
        examples=["https://hooks.example.com/cdiflow"],
        description="Where deliveries are POSTed (http or https; redirects are not followed).",
        json_schema_extra={"pattern": URL_PATTERN},
    )
    events: list[WebhookEvent] = Field(
        default_factory=lambda: list(RUN_ENDS),
        min_length=1,
        max_length=len(WebhookEvent),
        description="What to be told of; default: every end of a run. The task.* events "
        "come once per attempt of each step.",
    )
    workflow: str | None = Field(
        default=None,
        description="Only runs of this workflow definition; default: every run.",
        json_schema_extra=NAME_RULE,
    )
    # Checked by ``checked_secret``, not here: a validation error would echo it back.
    secret: str | None = Field(
        default=None,
        description="The signing secret: 'whsec_' and the base64 of 24-64 random bytes. "
        "Default: one is made. Shown in this answer only.",
        json_schema_extra={"pattern": SECRET_PATTERN},
    )

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return checked_name("webhook", value)

    @field_validator("workflow")
    @classmethod
    def _workflow(cls, value: str | None) -> str | None:
        return value if value is None else checked_name("workflow", value)

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        if "@" in urlsplit(value).netloc:
            raise ValueError("a URL with a user or password in it is refused; the deliveries "
                             "are signed: check the signature instead")  # fmt: skip
        if re.fullmatch(URL_PATTERN, value) is None:
            raise ValueError("give an http:// or https:// URL with a host name or address (and a "
                             "port), in printable ASCII without spaces")  # fmt: skip
        return value

    @field_validator("events")
    @classmethod
    def _events(cls, value: list[WebhookEvent]) -> list[WebhookEvent]:
        return list(dict.fromkeys(value))

    def checked_secret(self) -> str | None:
        """The secret given, once checked (``InvalidRequest`` saying what is wrong, without
        repeating it)."""
        problem = None if self.secret is None else secret_problem(self.secret)
        if problem is not None:
            raise InvalidRequest(problem, [problem])
        return self.secret


class WebhookPublic(ResponseBody):
    id: uuid.UUID
    name: str
    url: str
    events: list[str]
    workflow: str | None = Field(validation_alias=AliasChoices("workflow", "definition"))
    created_by: str | None
    created_at: datetime


class WebhookCreated(WebhookPublic):
    secret: str = Field(description="The signing secret: shown this once.")


class DeliveryPublic(ResponseBody):
    id: int = Field(description="Also the webhook-id header of every attempt.")
    event: str
    workflow_id: uuid.UUID | None
    status: DeliveryStatus
    attempts: int
    next_attempt_at: datetime = Field(description="PENDING: when it is tried (again).")
    last_status: int | None = Field(description="The receiver's HTTP status at the last try.")
    last_error: str | None
    created_at: datetime
    delivered_at: datetime | None
    payload: dict[str, Any] = Field(description="The body sent (as JSON).")


class DeliveryPage(BaseModel):
    """One page of a webhook's deliveries, newest first; the next page: ``before_id`` set to
    ``next_before_id``. A page costs the same however deep it is."""

    items: list[DeliveryPublic] = Field(description="Newest first.")
    next_before_id: int | None = Field(
        None, description="The before_id of the page of older deliveries; null on the last page."
    )
    has_more: bool = Field(False, description="Whether older deliveries follow.")
    total: int = Field(
        description="Deliveries matching over all pages, counted up to 1,000 (then "
        "total_exact is false and more may match)."
    )
    total_exact: bool = True
    limit: int
    offset: int
