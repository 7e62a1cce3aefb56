"""``/api/tasks``: the task definitions workers can run."""

from __future__ import annotations

from typing import Any

import redis
from fastapi import APIRouter, Request, Response

from orchestrator.controller.api.deps import RedisDep, SessionDep
from orchestrator.controller.api.params import TaskName
from orchestrator.controller.auth import Admin
from orchestrator.controller.strict_json import StrictJsonRoute
from orchestrator.controller.task_check import SETTINGS, live_catalogs, runnable_settings
from orchestrator.db import repository as repo
from orchestrator.errors import InvalidDefinition, InvalidRequest
from orchestrator.schemas import TaskCreate, TaskPublic, error_responses
from orchestrator.settings import Settings
from workflows.api import registration_problem

router = APIRouter(prefix="/tasks", tags=["tasks"], route_class=StrictJsonRoute)


def _definition(body: TaskCreate, request: Request, client: redis.Redis) -> dict[str, Any]:
    """The definition to store: ``body``, once its module is allowed (a deployed package or
    folder, a ``@task`` where the API can import it) and a live worker loaded it, with the
    settings it leaves out taken from the function's ``@task``."""
    settings: Settings = request.app.state.settings
    problem = registration_problem(body.module, settings.task_sources())
    if problem is not None:
        raise InvalidDefinition([problem], "task definition")
    spec = runnable_settings(body.module, live_catalogs(client))
    given = body.model_dump(exclude={"description", "max_concurrency"})
    return {**given, **{k: spec[k] for k in SETTINGS if given[k] is None}}


@router.post("", status_code=201, responses=error_responses(409, 422))
def create_task(
    body: TaskCreate,
    session: SessionDep,
    client: RedisDep,
    request: Request,
    response: Response,
    principal: Admin,
) -> TaskPublic:
    """Register a task definition; 409 if the name is taken (``PUT`` replaces one).

    422 when ``module`` is outside the packages tasks may come from
    (``CDIFLOW_TASK_PACKAGES``, ``CDIFLOW_TASK_PATHS``), is not a function decorated with
    ``@task`` (where the API can import it), or no live worker loaded it: then the message
    says what the workers met (an import error, the module's tasks, the modules they loaded).
    Settings left out come from the ``@task``.
    """
    row = repo.create_task_definition(
        session,
        _definition(body, request, client),
        description=body.description,
        max_concurrency=body.max_concurrency,
    )
    session.commit()
    response.headers["Location"] = f"/api/tasks/{row.name}"
    return TaskPublic.model_validate(row)


@router.put(
    "/{name}",
    responses={201: {"model": TaskPublic, "description": "Registered: the name was new."},
               **error_responses(422)},
)  # fmt: skip
def save_task(
    name: TaskName,
    body: TaskCreate,
    session: SessionDep,
    client: RedisDep,
    request: Request,
    response: Response,
    principal: Admin,
) -> TaskPublic:
    """Register a task definition or replace the one of that name (201 when it is new).

    Runs already claimed by a scheduler keep the settings they were claimed with. 422 as for
    ``POST``, or when the body names another task.
    """
    if body.name != name:
        problem = f"the body names task {body.name!r} but the path {name!r}"
        raise InvalidRequest(problem, [problem])
    row, created = repo.save_task_definition(
        session,
        _definition(body, request, client),
        description=body.description,
        max_concurrency=body.max_concurrency,
    )
    session.commit()
    if created:
        response.status_code = 201
        response.headers["Location"] = f"/api/tasks/{row.name}"
    return TaskPublic.model_validate(row)


@router.get("")
def list_tasks(session: SessionDep) -> list[TaskPublic]:
    """Every task definition, by name."""
    return [TaskPublic.model_validate(t) for t in repo.list_task_definitions(session)]


@router.get("/{name}", responses=error_responses(404))
def get_task(name: TaskName, session: SessionDep) -> TaskPublic:
    """One task definition; 404 if unknown."""
    return TaskPublic.model_validate(repo.get_task_definition(session, name))


@router.delete("/{name}", status_code=204, responses=error_responses(404, 409))
def delete_task(name: TaskName, session: SessionDep, principal: Admin) -> None:
    """Delete a task definition; 409 while a workflow definition uses it."""
    repo.delete_task_definition(session, name)
    session.commit()
