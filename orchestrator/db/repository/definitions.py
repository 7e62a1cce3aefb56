"""Task and workflow definitions: create, read, delete, and seed the bundled ones.

Functions take the caller's ``Session`` and never commit: the caller owns the transaction.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from orchestrator.db.models import TaskDefinition, WorkflowDefinition
from orchestrator.errors import Conflict, InvalidDefinition, NotFound
from workflows import definitions as bundled
from workflows.errors import InvalidDefinition as WorkflowsInvalidDefinition

__all__ = [
    "create_task_definition",
    "create_workflow_definition",
    "delete_task_definition",
    "get_task_definition",
    "get_workflow_definition",
    "list_task_definitions",
    "list_workflow_definitions",
    "seed_bundled_definitions",
    "task_names",
    "workflow_definition_names",
]


def list_task_definitions(session: Session) -> list[TaskDefinition]:
    """Every task definition, by name."""
    return list(session.scalars(select(TaskDefinition).order_by(TaskDefinition.name)))


def get_task_definition(session: Session, name: str) -> TaskDefinition:
    """The task definition called ``name``; raises ``NotFound``."""
    found = session.get(TaskDefinition, name)
    if found is None:
        raise NotFound("task", name)
    return found


def task_names(session: Session, *, lock: bool = False) -> list[str]:
    """Names of every task definition, sorted.

    ``lock=True`` share-locks the rows until the transaction ends, so a task cannot be deleted
    while a workflow definition that uses it is being stored.
    """
    query = select(TaskDefinition.name).order_by(TaskDefinition.name)
    if lock:
        query = query.with_for_update(read=True)
    return list(session.scalars(query))


def create_task_definition(
    session: Session, definition: Mapping[str, Any], *, description: str = ""
) -> TaskDefinition:
    """Store a new task definition (the ``workflows.definitions`` dict shape).

    Raises ``InvalidDefinition`` listing every problem, ``Conflict`` if the name is taken.
    """
    try:
        task = bundled.parse_task_definition(dict(definition))
    except WorkflowsInvalidDefinition as exc:
        raise InvalidDefinition(exc.problems, "task definition") from exc
    row: TaskDefinition | None = session.scalar(
        insert(TaskDefinition)
        .values(**task.to_dict(), description=description)
        .on_conflict_do_nothing(index_elements=[TaskDefinition.name])
        .returning(TaskDefinition)
    )
    if row is None:
        raise Conflict(f"task {task.name!r} already exists; delete it first to redefine it")
    return row


def delete_task_definition(session: Session, name: str) -> None:
    """Delete a task definition; ``Conflict`` if a workflow definition still uses it."""
    task = session.get(TaskDefinition, name, with_for_update=True)
    if task is None:
        raise NotFound("task", name)
    users = list(
        session.scalars(
            select(WorkflowDefinition.name)
            .where(WorkflowDefinition.tasks.contains([{"task": name}]))
            .order_by(WorkflowDefinition.name)
        )
    )
    if users:
        raise Conflict(
            f"task {name!r} is used by workflow definition(s) {', '.join(users)}; "
            "remove it from them first"
        )
    session.delete(task)
    session.flush()


def list_workflow_definitions(session: Session) -> list[WorkflowDefinition]:
    """Every workflow definition, by name."""
    return list(session.scalars(select(WorkflowDefinition).order_by(WorkflowDefinition.name)))


def workflow_definition_names(session: Session) -> list[str]:
    """Names of every workflow definition, sorted."""
    query = select(WorkflowDefinition.name).order_by(WorkflowDefinition.name)
    return list(session.scalars(query))


def get_workflow_definition(session: Session, name: str) -> WorkflowDefinition:
    """The workflow definition called ``name``; ``NotFound`` lists the known names."""
    found = session.get(WorkflowDefinition, name)
    if found is None:
        raise NotFound("workflow", name, known=workflow_definition_names(session))
    return found


def create_workflow_definition(session: Session, data: Mapping[str, Any]) -> WorkflowDefinition:
    """Validate ``data`` against the registered tasks and store it.

    Raises ``InvalidDefinition`` listing every problem (unknown task, duplicate ref, unknown
    dependency, cycle, ...) and ``Conflict`` if the name is taken.
    """
    known = task_names(session, lock=True)
    try:
        parsed = bundled.parse_workflow(dict(data), known)
    except WorkflowsInvalidDefinition as exc:
        name = data.get("name")
        raise InvalidDefinition(exc.problems, f"workflow {name!r}" if name else "workflow") from exc
    as_dict = parsed.to_dict()
    row: WorkflowDefinition | None = session.scalar(
        insert(WorkflowDefinition)
        .values(name=parsed.name, description=parsed.description, tasks=as_dict["tasks"])
        .on_conflict_do_nothing(index_elements=[WorkflowDefinition.name])
        .returning(WorkflowDefinition)
    )
    if row is None:
        raise Conflict(f"workflow {parsed.name!r} already exists; pick another name")
    return row


def seed_bundled_definitions(session: Session) -> list[str]:
    """Insert the bundled task and workflow definitions that are absent; return their names.

    Idempotent, and safe when several processes start at once (``ON CONFLICT DO NOTHING``).
    A definition a user has changed under a bundled name is left as it is.
    """
    tasks = [bundled.parse_task_definition(t).to_dict() for t in bundled.TASK_DEFINITIONS]
    added = list(
        session.scalars(
            insert(TaskDefinition)
            .values(tasks)
            .on_conflict_do_nothing(index_elements=[TaskDefinition.name])
            .returning(TaskDefinition.name)
        )
    )
    known = task_names(session)
    flows = [bundled.parse_workflow(w, known) for w in bundled.bundled_workflows().values()]
    rows = [{"name": w.name, "description": w.description, "tasks": w.to_dict()["tasks"]}
            for w in flows]  # fmt: skip
    added += session.scalars(
        insert(WorkflowDefinition)
        .values(rows)
        .on_conflict_do_nothing(index_elements=[WorkflowDefinition.name])
        .returning(WorkflowDefinition.name)
    )
    return added
