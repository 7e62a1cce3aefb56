"""Request and response bodies of the REST API, kept apart from the ORM models, one module a
resource; every body is importable from here.

``XCreate`` is what a client sends, ``XPublic`` what it gets back. Names, module paths and
bounds come from ``workflows`` so the API and the validator never disagree.
"""

from orchestrator.controller.schemas.cdi_directory import (
    CdiDirectoryPublic,
    CdiMinionPublic,
    CdiObjectPublic,
)
from orchestrator.controller.schemas.definitions import (
    StepSchema,
    WorkflowDefinitionCreate,
    WorkflowDefinitionPublic,
    WorkflowDefinitionSave,
    WorkflowDefinitionVersionPublic,
)
from orchestrator.controller.schemas.errors import (
    ErrorPublic,
    FieldErrorPublic,
    ValidationErrorPublic,
    error_responses,
)
from orchestrator.controller.schemas.health import (
    CheckPublic,
    LivenessPublic,
    ReadinessPublic,
    WorkerPublic,
)
from orchestrator.controller.schemas.images import ImagePublic, InputPublic, WorkflowImagesPublic
from orchestrator.controller.schemas.keys import IdentityPublic, KeyCreate, KeyCreated, KeyPublic
from orchestrator.controller.schemas.retention import (
    DefinitionRetentionPublic,
    RetentionPassPublic,
    RetentionPublic,
    RetentionSet,
)
from orchestrator.controller.schemas.runs import (
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
from orchestrator.controller.schemas.stats import (
    LatencyPublic,
    MinutePublic,
    StatsPublic,
    TaskTimingPublic,
)
from orchestrator.controller.schemas.tasks import TaskCreate, TaskPublic

__all__ = [
    "ActiveTaskRunPublic",
    "CdiDirectoryPublic",
    "CdiMinionPublic",
    "CdiObjectPublic",
    "CheckPublic",
    "DefinitionRetentionPublic",
    "ErrorPublic",
    "EventPage",
    "EventPublic",
    "FieldErrorPublic",
    "HandoffPublic",
    "IdentityPublic",
    "ImagePublic",
    "InputPublic",
    "KeyCreate",
    "KeyCreated",
    "KeyPublic",
    "LatencyPublic",
    "LivenessPublic",
    "MinutePublic",
    "ReadinessPublic",
    "RetentionPassPublic",
    "RetentionPublic",
    "RetentionSet",
    "StatsPublic",
    "StepSchema",
    "TaskCreate",
    "TaskPublic",
    "TaskRunInWorkflowPublic",
    "TaskRunPublic",
    "TaskTimingPublic",
    "ValidationErrorPublic",
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
