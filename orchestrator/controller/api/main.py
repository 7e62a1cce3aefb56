"""The ``/api`` router: every resource's routes in one place, each behind an API key.

Every router but ``health`` needs a key of any role (``require_viewer``); routes that change
state ask for a higher role themselves (``auth.Operator``, ``auth.Admin``). ``/api/healthz``
stays open: probes and load balancers ask it, and it tells nothing but "up".
"""

from __future__ import annotations

from fastapi import APIRouter, Depends

from orchestrator.controller.api.routes import (
    cdi,
    health,
    images,
    keys,
    stats,
    task_runs,
    tasks,
    workers,
    workflow_definitions,
    workflows,
)
from orchestrator.controller.auth import require_viewer

api_router = APIRouter()
_KEYED = [Depends(require_viewer)]
api_router.include_router(tasks.router, dependencies=_KEYED)
api_router.include_router(workflow_definitions.router, dependencies=_KEYED)
api_router.include_router(workflows.router, dependencies=_KEYED)
api_router.include_router(workers.router, dependencies=_KEYED)
api_router.include_router(keys.router, dependencies=_KEYED)
api_router.include_router(health.router)
# For the dashboard (dashboards/web): figures, live activity, CDI directory, thumbnails.
api_router.include_router(stats.router, dependencies=_KEYED)
api_router.include_router(task_runs.router, dependencies=_KEYED)
api_router.include_router(cdi.router, dependencies=_KEYED)
api_router.include_router(images.router, dependencies=_KEYED)
