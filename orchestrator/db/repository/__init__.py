"""What the API does to the database, as plain functions (the scheduler's statements are in
``db.run_statements``, sent by ``db.scheduler_store``).

Every function takes a ``Session`` and leaves committing to the caller; errors are the
``orchestrator.errors`` tree (``NotFound``, ``Conflict``, ``InvalidDefinition``).
"""

from orchestrator.db.repository.api_keys import (
    create_api_key,
    delete_api_key,
    install_configured_key,
    list_api_keys,
)
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
    pause_workflow_definition,
    save_task_definition,
    save_workflow_definition,
    seed_bundled_definitions,
    task_names,
    workflow_definition_names,
)
from orchestrator.db.repository.schedules import (
    create_schedule,
    delete_schedule,
    get_schedule,
    list_schedules,
    pause_schedule,
)
from orchestrator.db.repository.webhooks import (
    create_webhook,
    delete_webhook,
    get_webhook,
    list_deliveries,
    list_webhooks,
)
from orchestrator.db.repository.workflows import (
    WorkflowFilter,
    cancel_workflow,
    create_workflow,
    definition_not_found,
    ended_among,
    events_after,
    get_workflow,
    list_workflows,
    pause_workflow,
    retry_workflow,
)

__all__ = [
    "WorkflowFilter",
    "cancel_workflow",
    "create_api_key",
    "create_schedule",
    "create_task_definition",
    "create_webhook",
    "create_workflow",
    "create_workflow_definition",
    "definition_not_found",
    "delete_api_key",
    "delete_schedule",
    "delete_task_definition",
    "delete_webhook",
    "delete_workflow_definition",
    "ended_among",
    "events_after",
    "get_schedule",
    "get_task_definition",
    "get_webhook",
    "get_workflow",
    "get_workflow_definition",
    "get_workflow_definition_version",
    "install_configured_key",
    "list_api_keys",
    "list_deliveries",
    "list_schedules",
    "list_task_definitions",
    "list_webhooks",
    "list_workflow_definition_versions",
    "list_workflow_definitions",
    "list_workflows",
    "pause_schedule",
    "pause_workflow",
    "pause_workflow_definition",
    "retry_workflow",
    "save_task_definition",
    "save_workflow_definition",
    "seed_bundled_definitions",
    "task_names",
    "workflow_definition_names",
]
