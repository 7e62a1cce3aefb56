"""``/api/healthz`` (is this API process serving?) and ``/api/readyz`` (can a workflow run?).

Liveness and readiness are kept apart on purpose: a liveness probe that failed whenever
Postgres did would make Kubernetes restart healthy API processes during a database outage,
while readiness must say plainly which part is missing (``orchestrator.controller.readiness``).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from orchestrator.controller.api.deps import RedisDep, Resources
from orchestrator.controller.auth import MaybeKeyed
from orchestrator.controller.readiness import check_all
from orchestrator.controller.strict_json import StrictJsonRoute
from orchestrator.schemas import (
    CheckPublic,
    LivenessPublic,
    ReadinessPublic,
    ReadinessScope,
    error_responses,
)

router = APIRouter(tags=["health"], route_class=StrictJsonRoute)

_SCOPE = (
    "workflows: can a workflow run (every part it needs); api: can this API process answer "
    "(Postgres and Redis), for a load balancer's readiness probe."
)


@router.get("/healthz")
def healthz() -> LivenessPublic:
    """200 while this API process serves requests; it asks no other part."""
    return LivenessPublic(status="ok")


@router.get(
    "/readyz",
    responses={503: {"model": ReadinessPublic}, **error_responses(401)},
    response_model_exclude_none=True,
    # A key is optional here: probes send none. Anonymous callers learn ready or not only.
    openapi_extra={"security": [{}]},
)
def readyz(
    request: Request,
    client: RedisDep,
    response: Response,
    caller: MaybeKeyed,
    scope: Annotated[ReadinessScope, Query(description=_SCOPE)] = ReadinessScope.WORKFLOWS,
) -> ReadinessPublic:
    """200 when Postgres, Redis, the CDI minion, a scheduler, a worker and S3 all answer
    (``scope=api``: Postgres and Redis), else 503 (every check has a deadline of a few
    seconds). With a key of any role, the answer names each part and what was seen, and why
    one is not ready (``checks``); without one it says only ``ok`` or ``unavailable``: probes
    need no key, and anonymous callers learn nothing more."""
    resources: Resources = request.app.state.resources
    settings = request.app.state.settings
    checks = check_all(resources.engine, client, settings, scope)
    ready = all(check.ok for check in checks.values())
    if not ready:
        response.status_code = 503
    return ReadinessPublic(
        status="ok" if ready else "unavailable",
        checks=None
        if caller is None
        else {name: CheckPublic(ok=c.ok, detail=c.detail) for name, c in checks.items()},
    )
