"""Request and response bodies of the REST API, kept apart from the ORM models, one module a
resource; every body is importable from here.

``XCreate`` is what a client sends, ``XPublic`` what it gets back. Names, module paths and
bounds come from ``workflows`` so the API and the validator never disagree.

The API (``orchestrator.controller``) and its clients (``cdiflow.client`` and the ``cdiflow``
commands) both read these classes, so the two cannot disagree on a field. The package imports
pydantic, the vocabulary and ``workflows``' names only: no web framework, no database driver,
nothing that slows a client's start.
"""

from orchestrator.schemas.cdi_directory import (
    CdiChannelPublic,
    CdiDirectoryPublic,
    CdiMinionPublic,
    CdiObjectPublic,
)
from orchestrator.schemas.definitions import (
    StepSchema,
    WorkflowDefinitionCreate,
    WorkflowDefinitionPublic,
    WorkflowDefinitionSave,
    WorkflowDefinitionVersionPublic,
)
from orchestrator.schemas.errors import (
    ErrorPublic,
    FieldErrorPublic,
    ValidationErrorPublic,
    error_responses,
)
from orchestrator.schemas.health import (
    CheckPublic,
    InputCachePublic,
    LivenessPublic,
    ReadinessPublic,
    ReadinessScope,
    WorkerPublic,
)
from orchestrator.schemas.images import ImagePublic, InputPublic, WorkflowImagesPublic
from orchestrator.schemas.keys import IdentityPublic, KeyCreate, KeyCreated, KeyPublic
from orchestrator.schemas.retention import (
    DefinitionRetentionPublic,
    RetentionPassPublic,
    RetentionPublic,
    RetentionSet,
)
from orchestrator.schemas.runs import (
    ActiveTaskRunPublic,
    EventPage,
    EventPublic,
    HandoffPublic,
    TaskRunInWorkflowPublic,
    TaskRunPublic,
    WorkflowCreate,
    WorkflowDetail,
    WorkflowInput,
    WorkflowList,
    WorkflowPublic,
)
from orchestrator.schemas.schedules import ScheduleCreate, SchedulePublic
from orchestrator.schemas.stats import (
    LatencyPublic,
    MinutePublic,
    StatsPublic,
    TaskTimingPublic,
)
from orchestrator.schemas.tasks import TaskCreate, TaskPublic
from orchestrator.schemas.webhooks import (
    DeliveryPage,
    DeliveryPublic,
    WebhookCreate,
    WebhookCreated,
    WebhookPublic,
)

__all__ = [
    "ActiveTaskRunPublic",
    "CdiChannelPublic",
    "CdiDirectoryPublic",
    "CdiMinionPublic",
    "CdiObjectPublic",
    "CheckPublic",
    "DefinitionRetentionPublic",
    "DeliveryPage",
    "DeliveryPublic",
    "ErrorPublic",
    "EventPage",
    "EventPublic",
    "FieldErrorPublic",
    "HandoffPublic",
    "IdentityPublic",
    "ImagePublic",
    "InputCachePublic",
    "InputPublic",
    "KeyCreate",
    "KeyCreated",
    "KeyPublic",
    "LatencyPublic",
    "LivenessPublic",
    "MinutePublic",
    "ReadinessPublic",
    "ReadinessScope",
    "RetentionPassPublic",
    "RetentionPublic",
    "RetentionSet",
    "ScheduleCreate",
    "SchedulePublic",
    "StatsPublic",
    "StepSchema",
    "TaskCreate",
    "TaskPublic",
    "TaskRunInWorkflowPublic",
    "TaskRunPublic",
    "TaskTimingPublic",
    "ValidationErrorPublic",
    "WebhookCreate",
    "WebhookCreated",
    "WebhookPublic",
    "WorkerPublic",
    "WorkflowCreate",
    "WorkflowDefinitionCreate",
    "WorkflowDefinitionPublic",
    "WorkflowDefinitionSave",
    "WorkflowDefinitionVersionPublic",
    "WorkflowDetail",
    "WorkflowImagesPublic",
    "WorkflowInput",
    "WorkflowList",
    "WorkflowPublic",
    "error_responses",
]
