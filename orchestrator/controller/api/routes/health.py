"""``/api/healthz`` (is this API process serving?) and ``/api/readyz`` (can a workflow run?).

Liveness and readiness are kept apart on purpose: a liveness probe that failed whenever
Postgres did would make Kubernetes restart healthy API processes during a database outage,
while readiness must say plainly which part is missing (``orchestrator.controller.readiness``).
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from orchestrator.controller.api.deps import RedisDep, Resources
from orchestrator.controller.readiness import check_all
from orchestrator.controller.schemas import CheckPublic, LivenessPublic, ReadinessPublic
from orchestrator.controller.strict_json import StrictJsonRoute

router = APIRouter(tags=["health"], route_class=StrictJsonRoute)


@router.get("/healthz")
def healthz() -> LivenessPublic:
    """200 while this API process serves requests; it asks no other part."""
    return LivenessPublic(status="ok")


@router.get("/readyz", responses={503: {"model": ReadinessPublic}})
def readyz(request: Request, client: RedisDep, response: Response) -> ReadinessPublic:
    """200 when Postgres, Redis, the CDI minion, a scheduler, a worker and S3 all answer; 503
    naming each one that does not, and why (every check has a deadline of a few seconds)."""
    resources: Resources = request.app.state.resources
    checks = check_all(resources.engine, client, request.app.state.settings)
    ready = all(check.ok for check in checks.values())
    if not ready:
        response.status_code = 503
    return ReadinessPublic(
        status="ok" if ready else "unavailable",
        checks={name: CheckPublic(ok=c.ok, detail=c.detail) for name, c in checks.items()},
    )
