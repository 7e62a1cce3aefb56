"""What the API answers: the API's own models (``orchestrator.schemas``), under the names the
client has always used, read so that an older client keeps working against a newer API.

*Why the API's classes, not a copy:* one definition of each body means the client reads every
field, step kind and status the API has, the day the API has it. An answer is read with
``extra="allow"``: a field this version does not know is kept (``model.model_extra``, and in
``as_data``), not dropped; a status, policy or role it does not know stays the word the API
sent (a ``str`` where the enum member would be).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, Final

from pydantic import BaseModel, TypeAdapter
from pydantic_core import to_jsonable_python

from orchestrator.contract.vocabulary import WorkflowStatus
from orchestrator.schemas import (
    ActiveTaskRunPublic,
    CdiDirectoryPublic,
    DeliveryPage,
    DeliveryPublic,
    EventPage,
    EventPublic,
    HandoffPublic,
    IdentityPublic,
    InputPublic,
    KeyCreated,
    KeyPublic,
    LivenessPublic,
    ReadinessPublic,
    SchedulePublic,
    StatsPublic,
    StepSchema,
    TaskPublic,
    TaskRunInWorkflowPublic,
    TaskRunPublic,
    WebhookCreated,
    WebhookPublic,
    WorkerPublic,
    WorkflowDefinitionPublic,
    WorkflowDefinitionSave,
    WorkflowDefinitionVersionPublic,
    WorkflowDetail,
    WorkflowImagesPublic,
    WorkflowList,
    WorkflowPublic,
)

__all__ = [
    "ActiveTaskRun",
    "CdiDirectory",
    "Definition",
    "DefinitionVersion",
    "Delivery",
    "DeliveryPage",
    "Event",
    "EventPage",
    "Handoff",
    "Identity",
    "Key",
    "KeyCreated",
    "Liveness",
    "Readiness",
    "Schedule",
    "Stats",
    "Step",
    "Task",
    "TaskRun",
    "TaskRunInWorkflow",
    "Upload",
    "Webhook",
    "WebhookCreated",
    "Worker",
    "Workflow",
    "WorkflowDetail",
    "WorkflowImages",
    "WorkflowPage",
    "as_data",
    "definition_body",
    "has_ended",
    "read",
]

Task = TaskPublic  # a registered task definition
Definition = WorkflowDefinitionPublic  # a workflow definition at its current version
DefinitionVersion = WorkflowDefinitionVersionPublic  # one version of it
Step = StepSchema  # a step of a definition: task, switch or sub-workflow
Upload = InputPublic  # an input image in the stack's bucket: start a run with its uri
Workflow = WorkflowPublic  # one run of a workflow definition
WorkflowPage = WorkflowList  # one page of runs, newest first; total counts every match
TaskRun = TaskRunPublic  # one attempt of one step
Handoff = HandoffPublic  # a CDI ownership transfer (or share, or copy) made for a run
Event = EventPublic
Worker = WorkerPublic  # a worker as its latest heartbeat describes it
Identity = IdentityPublic  # the key a request was made with
Key = KeyPublic
Liveness = LivenessPublic
Readiness = ReadinessPublic
Stats = StatsPublic
ActiveTaskRun = ActiveTaskRunPublic
TaskRunInWorkflow = TaskRunInWorkflowPublic
CdiDirectory = CdiDirectoryPublic
WorkflowImages = WorkflowImagesPublic
Schedule = SchedulePublic  # runs of a definition at the ticks of a cron expression
Webhook = WebhookPublic  # where runs' (and steps') ends are POSTed, signed
Delivery = DeliveryPublic  # one event sent (or to send) to a webhook

# Fields of a stored definition the API sets itself (its version and times): what is left is
# what `apply_definition` sends, a field of a newer API included.
_SET_BY_THE_API: Final = frozenset(WorkflowDefinitionPublic.model_fields) - frozenset(
    WorkflowDefinitionSave.model_fields
)


@functools.cache
def _adapter(model: Any) -> TypeAdapter[Any]:
    return TypeAdapter(model)


def read(model: Any, body: Any) -> Any:
    """``body`` (JSON as parsed) as ``model`` (a model, ``list[...]`` of one, or a union),
    keeping the fields this version does not know; pydantic's ``ValidationError`` if it is
    not one."""
    return _adapter(model).validate_python(body, extra="allow")


def has_ended(status: WorkflowStatus | str) -> bool | None:
    """Whether a run with ``status`` has ended; ``None`` for a status this version does not
    know (ask the run: ``Workflow.finished`` decides by its end time)."""
    return status.finished if isinstance(status, WorkflowStatus) else None


def as_data(value: Any) -> Any:
    """A model (or a list of them, or plain data) as JSON-ready data, with every field the API
    sent: those this version does not know too."""
    if isinstance(value, BaseModel):
        return _with_extra(value, value.model_dump(mode="json"))
    if isinstance(value, list | tuple):
        return [as_data(item) for item in value]
    return to_jsonable_python(value)


def _with_extra(value: Any, dumped: Any) -> Any:
    """``dumped`` (``value`` dumped as JSON) with the unknown fields of every model inside."""
    if isinstance(value, BaseModel) and isinstance(dumped, dict):
        extra = value.model_extra or {}
        for name, inner in value:  # its fields, then the unknown ones
            if name in extra:
                dumped[name] = to_jsonable_python(inner)
            elif name in dumped:
                dumped[name] = _with_extra(inner, dumped[name])
    elif isinstance(value, list | tuple) and isinstance(dumped, list):
        dumped = [_with_extra(v, d) for v, d in zip(value, dumped, strict=True)]
    elif isinstance(value, Mapping) and isinstance(dumped, dict) and len(value) == len(dumped):
        dumped = {
            key: _with_extra(v, d)
            for (key, d), v in zip(dumped.items(), value.values(), strict=True)
        }
    return dumped


def definition_body(definition: Mapping[str, Any] | BaseModel) -> dict[str, Any]:
    """What saving ``definition`` sends: a mapping as it is; a definition read from the API
    (``Definition``, ``DefinitionVersion``) without what the API sets itself (version, times),
    with every other field it had, unknown ones included, so saving it again changes nothing.
    A field it has no value for (null) is left out: saving leaves it unset as it was."""
    if isinstance(definition, BaseModel):
        data = as_data(definition)
        return {k: v for k, v in data.items() if k not in _SET_BY_THE_API and v is not None}
    return dict(definition)
