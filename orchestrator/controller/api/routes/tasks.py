"""``/api/tasks``: the task definitions workers can run."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from orchestrator.controller.api.deps import SessionDep
from orchestrator.controller.api.params import TaskName
from orchestrator.controller.auth import Admin
from orchestrator.controller.schemas import TaskCreate, TaskPublic, error_responses
from orchestrator.controller.strict_json import StrictJsonRoute
from orchestrator.db import repository as repo
from orchestrator.errors import InvalidDefinition
from orchestrator.settings import Settings
from workflows.api import registration_problem

router = APIRouter(prefix="/tasks", tags=["tasks"], route_class=StrictJsonRoute)


@router.post("", status_code=201, responses=error_responses(409, 422))
def create_task(
    body: TaskCreate, session: SessionDep, request: Request, response: Response, principal: Admin
) -> TaskPublic:
    """Register a task definition; 409 if the name is taken. 422 when ``module`` is outside
    the packages tasks may come from (``CDIFLOW_TASK_PACKAGES``, ``CDIFLOW_TASK_PATHS``) or,
    where the API can import it, is not a function decorated with ``@task``."""
    settings: Settings = request.app.state.settings
    problem = registration_problem(body.module, settings.task_sources())
    if problem is not None:
        raise InvalidDefinition([problem], "task definition")
    row = repo.create_task_definition(
        session, body.model_dump(exclude={"description"}), description=body.description
    )
    session.commit()
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
