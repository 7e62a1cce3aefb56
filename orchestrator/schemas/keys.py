"""API keys: what issues one, a key as listed, the key shown once, who is asking."""

from __future__ import annotations

import uuid
from datetime import datetime

from pydantic import Field, field_validator

from orchestrator.apikeys import ADMIN_KEY_NAME, Role
from orchestrator.schemas.base import (
    NAME_RULE,
    OpenEnum,
    RequestBody,
    ResponseBody,
    checked_name,
)

__all__ = ["IdentityPublic", "KeyCreate", "KeyCreated", "KeyPublic"]


class KeyCreate(RequestBody):
    name: str = Field(
        examples=["ci-runner"],
        description="Letters, digits, '_', '-'; unique; not 'admin' (the configured key's).",
        json_schema_extra={**NAME_RULE, "not": {"const": ADMIN_KEY_NAME}},
    )
    role: Role = Field(
        Role.VIEWER,
        description="viewer: read everything; operator: also start, cancel and retry "
        "workflows; admin: also register tasks and definitions and manage keys.",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if value == ADMIN_KEY_NAME:
            raise ValueError(f"{value!r} is the name of the configured admin key; pick another")
        return checked_name("key", value)


class KeyPublic(ResponseBody):
    id: uuid.UUID
    name: str
    role: OpenEnum[Role]
    configured: bool = Field(description="The admin key from the API's settings (not revocable).")
    created_by: str | None = Field(description="Name of the key that issued it.")
    created_at: datetime


class KeyCreated(KeyPublic):
    key: str = Field(description="The key itself: shown this once; the API keeps a digest.")


class IdentityPublic(ResponseBody):
    """The key a request was made with."""

    id: uuid.UUID
    name: str
    role: OpenEnum[Role]
