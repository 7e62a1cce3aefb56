"""What the controller, scheduler and workers do to the database, as plain functions.

Every function takes a ``Session`` and leaves committing to the caller; errors are the
``orchestrator.errors`` tree (``NotFound``, ``Conflict``, ``InvalidDefinition``).
"""

from orchestrator.db.repository.definitions import (
    create_task_definition,
    create_workflow_definition,
    delete_task_definition,
    delete_workflow_definition,
    get_task_definition,
    get_workflow_definition,
    get_workflow_definition_version,
    list_task_definitions,
    list_workflow_definition_versions,
    list_workflow_definitions,
    save_task_definition,
    save_workflow_definition,
    seed_bundled_definitions,
    task_names,
    workflow_definition_names,
)
from orchestrator.db.repository.workflows import (
    WorkflowFilter,
    add_task_run,
    cancel_workflow,
    claim_pending_workflows,
    create_workflow,
    definition_not_found,
    ended_among,
    get_workflow,
    list_workflows,
    record_event,
    record_handoff,
    retry_workflow,
    set_workflow_status,
)

__all__ = [
    "WorkflowFilter",
    "add_task_run",
    "cancel_workflow",
    "claim_pending_workflows",
    "create_task_definition",
    "create_workflow",
    "create_workflow_definition",
    "definition_not_found",
    "delete_task_definition",
    "delete_workflow_definition",
    "ended_among",
    "get_task_definition",
    "get_workflow",
    "get_workflow_definition",
    "get_workflow_definition_version",
    "list_task_definitions",
    "list_workflow_definition_versions",
    "list_workflow_definitions",
    "list_workflows",
    "record_event",
    "record_handoff",
    "retry_workflow",
    "save_task_definition",
    "save_workflow_definition",
    "seed_bundled_definitions",
    "set_workflow_status",
    "task_names",
    "workflow_definition_names",
]
