"""The ``/api`` router: every resource's routes in one place, each behind an API key.

Every router but ``health`` needs a key of any role (``require_viewer``); routes that change
state ask for a higher role themselves (``auth.Operator``, ``auth.Admin``). ``/api/healthz``
stays open: probes and load balancers ask it, and it tells nothing but "up".
"""

from __future__ import annotations

from fastapi import APIRouter, Depends

from orchestrator.controller.api.routes import (
    cdi,
    files,
    health,
    images,
    keys,
    results,
    retention,
    schedules,
    stats,
    task_runs,
    tasks,
    webhooks,
    workers,
    workflow_definitions,
    workflows,
)
from orchestrator.controller.auth import require_viewer
from orchestrator.schemas import error_responses

# Any route may refuse a Host (400) or a request's shape (422); a keyed one a key (401, 403),
# or, at capacity, ask for the request again later (429 with Retry-After: its key is looked up
# on the connections a burst of starts fills).
api_router = APIRouter(responses=error_responses(400, 422))


def _keyed(router: APIRouter) -> None:
    api_router.include_router(
        router, dependencies=[Depends(require_viewer)], responses=error_responses(401, 403, 429)
    )


_keyed(tasks.router)
_keyed(workflow_definitions.router)
_keyed(workflows.router)
_keyed(files.router)
_keyed(results.router)
_keyed(workers.router)
_keyed(keys.router)
_keyed(retention.router)
_keyed(schedules.router)
_keyed(webhooks.router)
api_router.include_router(health.router)
# For the dashboard (dashboards/web): figures, live activity, CDI directory, thumbnails.
_keyed(stats.router)
_keyed(task_runs.router)
_keyed(cdi.router)
_keyed(images.router)
