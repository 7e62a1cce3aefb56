"""What the CDI controller knows, as the dashboard shows it: objects and minions."""

from __future__ import annotations

import uuid

from pydantic import Field

from orchestrator.schemas.base import ResponseBody

__all__ = ["CdiDirectoryPublic", "CdiMinionPublic", "CdiObjectPublic"]


class CdiObjectPublic(ResponseBody):
    key: str
    host: str = Field(description="Host whose minion holds the object's memory.")
    size: int = Field(description="Bytes.")
    owner: str = Field(description="Container that owns it now; empty when nobody does.")
    generation: int = Field(description="Bumped by every change of owner or size.")
    created_at: float = Field(description="Unix seconds.")
    updated_at: float = Field(description="Unix seconds of the last change.")
    age_s: float
    workflow_id: uuid.UUID | None = Field(description="The workflow whose data it is, if any.")


class CdiMinionPublic(ResponseBody):
    host: str
    alive: bool
    containers: int
    objects: int
    last_heartbeat: float = Field(description="Unix seconds.")
    heartbeat_age_s: float


class CdiDirectoryPublic(ResponseBody):
    """What the CDI controller knows now: every object and every minion."""

    objects: list[CdiObjectPublic]
    minions: list[CdiMinionPublic]
    total_bytes: int
