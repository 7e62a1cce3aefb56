"""``/api/workflow-definitions``: named DAGs of registered tasks, with their versions."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Response

from orchestrator.contract import wake_scheduler
from orchestrator.controller.api.deps import RedisDep, SessionDep
from orchestrator.controller.api.params import DefinitionName
from orchestrator.controller.auth import Admin, Operator
from orchestrator.controller.strict_json import StrictJsonRoute
from orchestrator.db import repository as repo
from orchestrator.errors import InvalidRequest
from orchestrator.schemas import (
    WorkflowDefinitionCreate,
    WorkflowDefinitionPublic,
    WorkflowDefinitionSave,
    WorkflowDefinitionVersionPublic,
    error_responses,
)
from orchestrator.schemas.definitions import QUEUE_SETTINGS

router = APIRouter(
    prefix="/workflow-definitions", tags=["workflow definitions"], route_class=StrictJsonRoute
)


def _location(name: str, response: Response) -> None:
    response.headers["Location"] = f"/api/workflow-definitions/{name}"


@router.post("", status_code=201, responses=error_responses(409, 422))
def create_workflow_definition(
    body: WorkflowDefinitionCreate, session: SessionDep, response: Response, principal: Admin
) -> WorkflowDefinitionPublic:
    """Register a workflow definition (version 1).

    422 lists every problem: an unknown task, a duplicate ref, a dependency on an unknown
    step, a cycle. 409 if the name is taken (``PUT`` saves a new version).
    """
    row = repo.create_workflow_definition(
        session, body.model_dump(exclude=set(QUEUE_SETTINGS)), body.given_settings()
    )
    session.commit()
    _location(row.name, response)
    return WorkflowDefinitionPublic.model_validate(row)


@router.put("/{name}", responses=error_responses(422))
def save_workflow_definition(
    name: DefinitionName,
    body: WorkflowDefinitionSave,
    session: SessionDep,
    response: Response,
    principal: Admin,
) -> WorkflowDefinitionPublic:
    """Save a new version of a workflow definition (201 when it did not exist yet), and its
    queue settings (``priority``, ``max_concurrent_runs``) that the body names.

    New runs run the new version; runs already started keep theirs. Steps and description
    equal to the current version's save nothing and answer the current version, so applying
    the same definition twice is harmless. 422 as for ``POST``, or when the body names
    another definition.
    """
    if body.name is not None and body.name != name:
        problem = f"the body names workflow {body.name!r} but the path {name!r}"
        raise InvalidRequest(problem, [problem])
    existed = name in repo.workflow_definition_names(session)
    steps = {**body.model_dump(exclude=set(QUEUE_SETTINGS)), "name": name}
    row, _changed = repo.save_workflow_definition(session, steps, body.given_settings())
    session.commit()
    if not existed:
        response.status_code = 201
        _location(row.name, response)
    return WorkflowDefinitionPublic.model_validate(row)


@router.get("")
def list_workflow_definitions(session: SessionDep) -> list[WorkflowDefinitionPublic]:
    """Every workflow definition, by name, at its current version."""
    rows = repo.list_workflow_definitions(session)
    return [WorkflowDefinitionPublic.model_validate(r) for r in rows]


@router.get("/{name}", responses=error_responses(404))
def get_workflow_definition(name: DefinitionName, session: SessionDep) -> WorkflowDefinitionPublic:
    """One workflow definition at its current version; 404 (with the known names) if unknown."""
    return WorkflowDefinitionPublic.model_validate(repo.get_workflow_definition(session, name))


@router.get("/{name}/versions", responses=error_responses(404))
def list_workflow_definition_versions(
    name: DefinitionName, session: SessionDep
) -> list[WorkflowDefinitionVersionPublic]:
    """Every version of a workflow definition, newest first."""
    rows = repo.list_workflow_definition_versions(session, name)
    return [WorkflowDefinitionVersionPublic.model_validate(r) for r in rows]


@router.get("/{name}/versions/{version}", responses=error_responses(404))
def get_workflow_definition_version(
    name: DefinitionName, version: Annotated[int, Path(ge=1, le=2**31 - 1)], session: SessionDep
) -> WorkflowDefinitionVersionPublic:
    """One version of a workflow definition (also of a deleted one: runs on record name it)."""
    row = repo.get_workflow_definition_version(session, name, version)
    return WorkflowDefinitionVersionPublic.model_validate(row)


@router.delete("/{name}", status_code=204, responses=error_responses(404, 409))
def delete_workflow_definition(name: DefinitionName, session: SessionDep, principal: Admin) -> None:
    """Delete a workflow definition; 409 while a pending or running run uses any version of
    it. Its versions stay readable for the runs on record; the name may be created again."""
    repo.delete_workflow_definition(session, name)
    session.commit()


@router.post("/{name}/pause", responses=error_responses(404))
def pause_workflow_definition(
    name: DefinitionName, session: SessionDep, principal: Operator
) -> WorkflowDefinitionPublic:
    """Pause the definition's queue: its new runs (and those not claimed yet) wait PENDING
    until ``resume``; runs already RUNNING go on. Pausing a paused queue changes nothing."""
    row = repo.pause_workflow_definition(session, name, paused=True)
    session.commit()
    return WorkflowDefinitionPublic.model_validate(row)


@router.post("/{name}/resume", responses=error_responses(404))
def resume_workflow_definition(
    name: DefinitionName, session: SessionDep, client: RedisDep, principal: Operator
) -> WorkflowDefinitionPublic:
    """Let the definition's waiting runs be claimed again."""
    row = repo.pause_workflow_definition(session, name, paused=False)
    session.commit()
    wake_scheduler(client, None)
    return WorkflowDefinitionPublic.model_validate(row)
