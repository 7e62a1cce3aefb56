"""What the CDI controller knows, as the dashboard shows it: objects, minions and channels."""

from __future__ import annotations

import uuid

from pydantic import Field

from orchestrator.schemas.base import ResponseBody

__all__ = ["CdiChannelPublic", "CdiDirectoryPublic", "CdiMinionPublic", "CdiObjectPublic"]


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
    keeps_objects: bool = Field(
        description="It has a state folder: its objects, owners and shares outlive a restart "
        "of its process (docs/minion-restart.md)."
    )
    restarts: int = Field(
        description="With a state folder: how many times a minion took its objects over from "
        "another since they began (a host reboot begins anew); 0 without one."
    )
    kept_objects: int = Field(
        description="The objects the minion found again when it last started (0 after a start "
        "with nothing to take over)."
    )


class CdiChannelPublic(ResponseBody):
    """A channel topic open now (``cdi.channels``), as its objects show it: a ring its writer
    owns (``channel/<name>``) and a cursor per reader that joined it."""

    name: str = Field(description="The topic's name (a stream is two: '<name>.<end>').")
    host: str = Field(description="Host whose minion holds its ring.")
    writer: str = Field(description="Container that writes it (owns its ring).")
    readers: list[str] = Field(description="Containers that joined it, by name.")
    ring_bytes: int = Field(description="Bytes of its ring.")
    created_at: float = Field(description="Unix seconds.")


class CdiDirectoryPublic(ResponseBody):
    """What the CDI controller knows now: every object and every minion."""

    objects: list[CdiObjectPublic]
    minions: list[CdiMinionPublic]
    channels: list[CdiChannelPublic] = Field(
        description="Channel topics open now, from their objects in the directory."
    )
    total_bytes: int
