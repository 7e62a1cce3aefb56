"""``/api/cdi``: the CDI controller's live directory — every object, its owner and host, every
minion, and the channel topics open now (found from their objects: there is no other record of
them).

The API process finds the controller through ``CDI_CONTROLLER_URL`` and shows it a reader's
token (``CDI_CONTROLLER_TOKEN_FILE`` or ``CDI_CONTROLLER_TOKEN``; the stack sets both). The
directory is soft state the minions report asynchronously, so it may trail the minion by a
heartbeat; that is fine for watching ownership move. Any CDI failure answers 503.
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Final

from fastapi import APIRouter

from cdi.auth import Role, controller_token
from cdi.channels.ring import channel_of
from cdi.controller.client import ControllerClient, ObjectInfo
from cdi.errors import AccessDenied, CDIError, NotAuthenticated
from orchestrator.contract import keys
from orchestrator.controller.strict_json import StrictJsonRoute
from orchestrator.errors import ConfigError, ServiceError
from orchestrator.schemas import (
    CdiChannelPublic,
    CdiDirectoryPublic,
    CdiMinionPublic,
    CdiObjectPublic,
    error_responses,
)

router = APIRouter(prefix="/cdi", tags=["cdi"], route_class=StrictJsonRoute)

CONTROLLER_URL_ENV: Final = "CDI_CONTROLLER_URL"
# The directory is for watching; a slow controller must not hold a request for long.
_TIMEOUT_S: Final = 2.0


def workflow_of(key: str) -> uuid.UUID | None:
    """The workflow an object key belongs to, when it follows the scheduler's naming."""
    return keys.workflow_of_object(key)


def check_reader_token() -> None:
    """At start: with ``CDI_CONTROLLER_URL`` set, a token the API was given must read as a
    reader's (a placeholder left in a Secret is refused here, not at the first request);
    ``ConfigError`` saying so. Without a token, the directory answers 503 saying why."""
    if not os.environ.get(CONTROLLER_URL_ENV):
        return
    try:
        controller_token(Role.READER)
    except CDIError as exc:
        raise ConfigError(str(exc)) from exc


def _controller_url() -> str:
    url = os.environ.get(CONTROLLER_URL_ENV, "")
    if not url:
        raise ServiceError(
            f"{CONTROLLER_URL_ENV} is not set, so the API cannot reach the CDI controller; "
            "run the API with `cdiflow up`, or set it to grpc://host:port",
            service="cdi-controller",
        )
    return url


def channels(objects: list[ObjectInfo]) -> list[CdiChannelPublic]:
    """The channel topics among ``objects``: each ring, with the readers whose cursor is on
    its host (``cdi.channels``: a reader's cursor lives beside the ring it reads)."""
    rings: dict[tuple[str, str], ObjectInfo] = {}
    readers: dict[tuple[str, str], list[str]] = {}
    for o in objects:
        found = channel_of(o.key)
        if found is None:
            continue
        name, reader = found
        if reader is None:
            rings[(o.host, name)] = o
        else:
            readers.setdefault((o.host, name), []).append(reader)
    return [
        CdiChannelPublic(
            name=name,
            host=host,
            writer=ring.owner,
            readers=sorted(readers.get((host, name), [])),
            ring_bytes=ring.size,
            created_at=ring.created_at,
        )
        for (host, name), ring in sorted(rings.items())
    ]


@router.get("/objects", responses=error_responses(503))
def cdi_directory() -> CdiDirectoryPublic:
    """Every CDI object (key, size, owner, host, age) and every minion, from the controller."""
    url = _controller_url()
    try:
        with ControllerClient(url, timeout=_TIMEOUT_S) as client:
            objects = client.list_objects()
            minions = client.list_minions()
    except (NotAuthenticated, AccessDenied) as exc:
        raise ServiceError(
            f"the CDI controller at {url} refused the API: {exc}; the API reads its token "
            "from CDI_CONTROLLER_TOKEN_FILE (or CDI_CONTROLLER_TOKEN), a reader's",
            service="cdi-controller",
        ) from exc
    except CDIError as exc:
        raise ServiceError(
            f"the CDI controller at {url} did not answer: {exc}", service="cdi-controller"
        ) from exc
    now = time.time()
    return CdiDirectoryPublic(
        objects=[
            CdiObjectPublic(
                key=o.key,
                host=o.host,
                size=o.size,
                owner=o.owner,
                generation=o.generation,
                created_at=o.created_at,
                updated_at=o.updated_at,
                age_s=max(0.0, now - o.created_at),
                workflow_id=workflow_of(o.key),
            )
            for o in objects
        ],
        minions=[
            CdiMinionPublic(
                host=m.host,
                alive=m.alive,
                containers=m.containers,
                objects=m.objects,
                last_heartbeat=m.last_heartbeat,
                heartbeat_age_s=max(0.0, now - m.last_heartbeat),
                keeps_objects=m.keeps_objects,
                restarts=m.restarts,
                kept_objects=m.kept_objects,
            )
            for m in minions
        ],
        channels=channels(objects),
        total_bytes=sum(o.size for o in objects),
    )
