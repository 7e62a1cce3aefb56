"""``/api/workflow-definitions``: named DAGs of registered tasks."""

from __future__ import annotations

from fastapi import APIRouter, Response

from orchestrator.controller.api.deps import SessionDep
from orchestrator.controller.api.params import DefinitionName
from orchestrator.controller.auth import Admin
from orchestrator.controller.schemas import (
    WorkflowDefinitionCreate,
    WorkflowDefinitionPublic,
    error_responses,
)
from orchestrator.controller.strict_json import StrictJsonRoute
from orchestrator.db import repository as repo

router = APIRouter(
    prefix="/workflow-definitions", tags=["workflow definitions"], route_class=StrictJsonRoute
)


@router.post("", status_code=201, responses=error_responses(409, 422))
def create_workflow_definition(
    body: WorkflowDefinitionCreate, session: SessionDep, response: Response, principal: Admin
) -> WorkflowDefinitionPublic:
    """Register a workflow definition.

    422 lists every problem: an unknown task, a duplicate ref, a dependency on an unknown
    step, a cycle. 409 if the name is taken.
    """
    row = repo.create_workflow_definition(session, body.model_dump())
    session.commit()
    response.headers["Location"] = f"/api/workflow-definitions/{row.name}"
    return WorkflowDefinitionPublic.model_validate(row)


@router.get("")
def list_workflow_definitions(session: SessionDep) -> list[WorkflowDefinitionPublic]:
    """Every workflow definition, by name."""
    rows = repo.list_workflow_definitions(session)
    return [WorkflowDefinitionPublic.model_validate(r) for r in rows]


@router.get("/{name}", responses=error_responses(404))
def get_workflow_definition(name: DefinitionName, session: SessionDep) -> WorkflowDefinitionPublic:
    """One workflow definition; 404 (with the known names) if unknown."""
    return WorkflowDefinitionPublic.model_validate(repo.get_workflow_definition(session, name))
