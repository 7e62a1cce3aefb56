"""Task and workflow definitions: create, save new versions, read, delete, and seed the
bundled ones.

Functions take the caller's ``Session`` and never commit: the caller owns the transaction.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import ColumnElement, func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from orchestrator.contract.vocabulary import WorkflowStatus
from orchestrator.db.models import (
    TaskDefinition,
    Workflow,
    WorkflowDefinition,
    WorkflowDefinitionVersion,
)
from orchestrator.errors import Conflict, InvalidDefinition, NotFound
from workflows import definitions as bundled
from workflows.errors import InvalidDefinition as WorkflowsInvalidDefinition

__all__ = [
    "create_task_definition",
    "create_workflow_definition",
    "delete_task_definition",
    "delete_workflow_definition",
    "get_task_definition",
    "get_workflow_definition",
    "get_workflow_definition_version",
    "list_task_definitions",
    "list_workflow_definition_versions",
    "list_workflow_definitions",
    "pause_workflow_definition",
    "save_task_definition",
    "save_workflow_definition",
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
    session: Session,
    definition: Mapping[str, Any],
    *,
    description: str = "",
    max_concurrency: int | None = None,
) -> TaskDefinition:
    """Store a new task definition (the ``workflows.definitions`` dict shape).

    Raises ``InvalidDefinition`` listing every problem, ``Conflict`` if the name is taken.
    """
    task = _parsed_task(definition)
    row: TaskDefinition | None = session.scalar(
        insert(TaskDefinition)
        .values(**task.to_dict(), description=description, max_concurrency=max_concurrency)
        .on_conflict_do_nothing(index_elements=[TaskDefinition.name])
        .returning(TaskDefinition)
    )
    if row is None:
        raise Conflict(
            f"task {task.name!r} already exists; replace it with PUT /api/tasks/{task.name}"
        )
    return row


def save_task_definition(
    session: Session,
    definition: Mapping[str, Any],
    *,
    description: str = "",
    max_concurrency: int | None = None,
) -> tuple[TaskDefinition, bool]:
    """Store a task definition, replacing the one of that name if any; ``(row, created)``.

    Runs already claimed keep the settings they were claimed with. Raises
    ``InvalidDefinition`` listing every problem.
    """
    task = _parsed_task(definition)
    values = {**task.to_dict(), "description": description, "max_concurrency": max_concurrency}
    existed = session.get(TaskDefinition, task.name, with_for_update=True) is not None
    statement = insert(TaskDefinition).values(**values)
    changes: dict[str, Any] = {k: statement.excluded[k] for k in values if k != "name"}
    row = session.scalar(
        statement.on_conflict_do_update(
            index_elements=[TaskDefinition.name], set_={**changes, "updated_at": func.now()}
        )
        .returning(TaskDefinition)
        .execution_options(populate_existing=True)
    )
    assert row is not None
    return row, not existed


def _parsed_task(definition: Mapping[str, Any]) -> bundled.TaskDefinition:
    try:
        return bundled.parse_task_definition(dict(definition))
    except WorkflowsInvalidDefinition as exc:
        raise InvalidDefinition(exc.problems, "task definition") from exc


def delete_task_definition(session: Session, name: str) -> None:
    """Delete a task definition; ``Conflict`` if the current version of a workflow definition
    uses it, or a pending or running run's version does (older versions may name tasks that
    are gone: a retry of such a run fails, saying which task is missing)."""
    task = session.get(TaskDefinition, name, with_for_update=True)
    if task is None:
        raise NotFound("task", name)
    uses = WorkflowDefinitionVersion.tasks.contains([{"task": name}])
    active = session.scalar(
        select(func.count())
        .select_from(Workflow)
        .join(
            WorkflowDefinitionVersion,
            (WorkflowDefinitionVersion.name == Workflow.definition)
            & (WorkflowDefinitionVersion.version == Workflow.definition_version),
        )
        .where(Workflow.status.in_([WorkflowStatus.PENDING, WorkflowStatus.RUNNING]), uses)
    )
    if active:
        raise Conflict(
            f"task {name!r} is used by {active} pending or running run(s); cancel them or wait "
            "until they end, then delete it"
        )
    users = list(
        session.scalars(
            select(WorkflowDefinition.name)
            .where(WorkflowDefinition.tasks.contains([{"task": name}]), _live())
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
    """Every workflow definition that is not deleted, by name (each at its current version)."""
    query = select(WorkflowDefinition).where(_live()).order_by(WorkflowDefinition.name)
    return list(session.scalars(query))


def workflow_definition_names(session: Session) -> list[str]:
    """Names of every workflow definition that is not deleted, sorted."""
    query = select(WorkflowDefinition.name).where(_live()).order_by(WorkflowDefinition.name)
    return list(session.scalars(query))


def get_workflow_definition(session: Session, name: str) -> WorkflowDefinition:
    """The workflow definition called ``name`` at its current version; ``NotFound`` lists the
    known names (a deleted definition is not found)."""
    found = session.get(WorkflowDefinition, name)
    if found is None or found.deleted_at is not None:
        raise NotFound("workflow", name, known=workflow_definition_names(session))
    return found


def list_workflow_definition_versions(
    session: Session, name: str
) -> list[WorkflowDefinitionVersion]:
    """Every version of a (not deleted) workflow definition, newest first; ``NotFound``."""
    get_workflow_definition(session, name)
    query = (
        select(WorkflowDefinitionVersion)
        .where(WorkflowDefinitionVersion.name == name)
        .order_by(WorkflowDefinitionVersion.version.desc())
    )
    return list(session.scalars(query))


def get_workflow_definition_version(
    session: Session, name: str, version: int
) -> WorkflowDefinitionVersion:
    """One version of a workflow definition, also of a deleted one (runs on record name it);
    ``NotFound`` says which versions exist."""
    found = session.get(WorkflowDefinitionVersion, (name, version))
    if found is None:
        versions = [str(v) for v in _version_numbers(session, name)]
        raise NotFound(f"version {version} of workflow", name, known=versions)
    return found


def create_workflow_definition(
    session: Session, data: Mapping[str, Any], settings: Mapping[str, Any] | None = None
) -> WorkflowDefinition:
    """Validate ``data`` against the registered tasks and store it as a new definition.

    Raises ``InvalidDefinition`` listing every problem (unknown task, duplicate ref, unknown
    dependency, cycle, ...) and ``Conflict`` if a definition of that name exists (``save``
    stores a new version of it). A deleted definition's name may be created again: its
    versions go on from where they stopped.
    """
    parsed = _parsed_workflow(session, data)
    row = session.get(WorkflowDefinition, parsed.name, with_for_update=True)
    if row is not None and row.deleted_at is None:
        raise Conflict(
            f"workflow {parsed.name!r} already exists; save a new version of it with "
            f"PUT /api/workflow-definitions/{parsed.name}, or pick another name"
        )
    row, _changed = _store_version(session, row, parsed, settings)
    return row


def save_workflow_definition(
    session: Session, data: Mapping[str, Any], settings: Mapping[str, Any] | None = None
) -> tuple[WorkflowDefinition, bool]:
    """Store ``data`` as the definition's new current version, creating the definition when
    there is none; ``(row, changed)``. Steps, description and run limits equal to the current
    version's store nothing (``changed`` is False), so applying the same file twice is
    harmless. ``settings`` (``priority``, ``max_concurrent_runs``) are the queue's, not the
    version's: those given replace the current ones, the others stay.

    Runs already started keep the version they were started with. Raises
    ``InvalidDefinition`` as ``create_workflow_definition`` does.
    """
    parsed = _parsed_workflow(session, data)
    row = session.get(WorkflowDefinition, parsed.name, with_for_update=True)
    return _store_version(session, row, parsed, settings)


def pause_workflow_definition(session: Session, name: str, *, paused: bool) -> WorkflowDefinition:
    """Pause (``paused``) or resume the definition's queue: while paused, none of its PENDING
    runs is claimed. ``NotFound`` lists the known names."""
    row = get_workflow_definition(session, name)
    if paused and row.paused_at is None:
        row.paused_at = func.now()
    elif not paused:
        row.paused_at = None
    session.flush()
    session.refresh(row)
    return row


def delete_workflow_definition(session: Session, name: str) -> None:
    """Delete a workflow definition: it takes no new runs and leaves the lists; its versions
    stay, for the runs on record. ``Conflict`` while a PENDING or RUNNING run uses any of
    its versions (cancel them or wait); ``NotFound`` if there is none."""
    row = session.get(WorkflowDefinition, name, with_for_update=True)
    if row is None or row.deleted_at is not None:
        raise NotFound("workflow", name, known=workflow_definition_names(session))
    # The row lock comes first: a start waits for it (see CREATE_STATEMENT), so no new run
    # can slip in between this count and the delete.
    active = session.execute(
        select(Workflow.definition_version, func.count())
        .where(
            Workflow.definition == name,
            Workflow.status.in_([WorkflowStatus.PENDING, WorkflowStatus.RUNNING]),
        )
        .group_by(Workflow.definition_version)
        .order_by(Workflow.definition_version)
    ).all()
    if active:
        runs = sum(count for _version, count in active)
        versions = ", ".join(str(version) for version, _count in active)
        raise Conflict(
            f"workflow {name!r} has {runs} pending or running run(s) (version(s) {versions}); "
            "cancel them or wait until they end, then delete it"
        )
    row.deleted_at = func.now()
    session.flush()


def _live() -> ColumnElement[bool]:
    return WorkflowDefinition.deleted_at.is_(None)


def _version_numbers(session: Session, name: str) -> list[int]:
    query = (
        select(WorkflowDefinitionVersion.version)
        .where(WorkflowDefinitionVersion.name == name)
        .order_by(WorkflowDefinitionVersion.version)
    )
    return list(session.scalars(query))


def _parsed_workflow(session: Session, data: Mapping[str, Any]) -> bundled.WorkflowDefinition:
    known = task_names(session, lock=True)
    try:
        return bundled.parse_workflow(dict(data), known, workflow_definition_names(session))
    except WorkflowsInvalidDefinition as exc:
        name = data.get("name")
        raise InvalidDefinition(exc.problems, f"workflow {name!r}" if name else "workflow") from exc


def _store_version(
    session: Session,
    row: WorkflowDefinition | None,
    parsed: bundled.WorkflowDefinition,
    settings: Mapping[str, Any] | None = None,
) -> tuple[WorkflowDefinition, bool]:
    """Make ``parsed`` the current version of ``row`` (locked by the caller; ``None``: a new
    definition, version 1), with the queue ``settings`` given; ``(row, changed)``."""
    content = {
        "description": parsed.description,
        "tasks": parsed.to_dict()["tasks"],
        "timeout_s": parsed.timeout_s,
        "worker_wait_s": parsed.worker_wait_s,
    }
    if row is None:
        row = WorkflowDefinition(name=parsed.name, version=1, **content)
        session.add(row)
    elif row.deleted_at is None and all(getattr(row, k) == v for k, v in content.items()):
        for key, value in (settings or {}).items():
            setattr(row, key, value)
        session.flush()
        return row, False
    else:
        row.version = max(_version_numbers(session, parsed.name), default=0) + 1
        row.deleted_at = None
        for key, value in content.items():
            setattr(row, key, value)
    for key, value in (settings or {}).items():
        setattr(row, key, value)
    session.flush()
    session.add(WorkflowDefinitionVersion(name=row.name, version=row.version, **content))
    session.flush()
    session.refresh(row)
    return row, True


def seed_bundled_definitions(session: Session) -> list[str]:
    """Insert the bundled task and workflow definitions that are absent; return their names.

    Idempotent, and safe when several processes start at once (``ON CONFLICT DO NOTHING``).
    A definition a user has changed under a bundled name is left as it is.
    """
    tasks = [bundled.parse_task_definition(t).to_dict() for t in bundled.TASK_DEFINITIONS]
    added = _insert_absent(session, TaskDefinition, tasks)
    known = task_names(session)
    flows = [bundled.parse_workflow(w, known) for w in bundled.bundled_workflows().values()]
    rows = [{"name": w.name, "description": w.description, "tasks": w.to_dict()["tasks"]}
            for w in flows]  # fmt: skip
    flows_added = _insert_absent(session, WorkflowDefinition, rows)
    versions = [{**r, "version": 1} for r in rows if r["name"] in flows_added]
    if versions:
        session.execute(insert(WorkflowDefinitionVersion).values(versions))
    return added + flows_added


def _insert_absent(
    session: Session,
    model: type[TaskDefinition] | type[WorkflowDefinition],
    rows: list[dict[str, Any]],
) -> list[str]:
    """Insert the rows whose name is not taken; the names inserted."""
    statement = (
        insert(model)
        .values(rows)
        .on_conflict_do_nothing(index_elements=[model.name])
        .returning(model.name)
    )
    return list(session.scalars(statement))
