"""The ``/api`` router: every resource's routes in one place."""

from __future__ import annotations

from fastapi import APIRouter

from orchestrator.controller.api.routes import (
    cdi,
    files,
    health,
    images,
    stats,
    task_runs,
    tasks,
    workers,
    workflow_definitions,
    workflows,
)

api_router = APIRouter()
api_router.include_router(tasks.router)
api_router.include_router(workflow_definitions.router)
api_router.include_router(workflows.router)
api_router.include_router(files.router)
api_router.include_router(workers.router)
api_router.include_router(health.router)
# For the dashboard (dashboards/web): figures, live activity, CDI directory, thumbnails.
api_router.include_router(stats.router)
api_router.include_router(task_runs.router)
api_router.include_router(cdi.router)
api_router.include_router(images.router)
