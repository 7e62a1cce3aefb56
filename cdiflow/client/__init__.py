"""The cdiflow API from Python: ``Client`` (blocking) and ``AsyncClient`` (asyncio).

    from cdiflow.client import Client

    with Client() as api:   # the local stack, or api_url= / $CDIFLOW_API_URL
        api.register_task("sharpen", "mytasks:sharpen")
        api.apply_definition({"name": "sharpen_then_classify", "tasks": [
            {"ref": "sharpen", "task": "sharpen"},
            {"ref": "classify", "task": "classify", "depends_on": ["sharpen"]}]})
        run = api.run("sharpen_then_classify", "photo.jpg")   # upload, start, wait
        print(run.output["label"])
        api.download_result(run.id, "result.png")

Every route of the REST API is a method: tasks (``register_task``, ``tasks``, ...), workflow
definitions (``apply_definition``, ``definition_versions``, ``delete_definition``, ...), inputs
(``upload``), runs (``start``, ``wait``, ``run``, ``events``, ``download_result``,
``save_result``, ``list_workflows``, ``iter_workflows``, ``cancel``, ``retry``, ``pause``,
``resume``, ``images``), schedules (``create_schedule``, ``schedules``, ``pause_schedule``,
...), webhooks (``create_webhook``, ``deliveries``, ...), task runs, ``workers``,
``cdi_objects``, ``stats``, retention (``retention``, ``set_retention``), API keys and health.
Errors come from one tree,
``cdiflow.client.errors``, mapped from the API's error codes.

The answers are the API's own models (``orchestrator.schemas``, under the names below), read
so that fields, step kinds and statuses of a newer API are kept: ``cdiflow.client.models``.
"""

from cdiflow.client._calls import SavedResult
from cdiflow.client.aio import AsyncClient
from cdiflow.client.config import Endpoint, resolve
from cdiflow.client.errors import (
    APIError,
    CdiflowError,
    ConfigError,
    Conflict,
    Forbidden,
    InvalidRequest,
    NotFound,
    RequestTooLarge,
    ServiceUnavailable,
    TooManyRequests,
    TransportError,
    Unauthorized,
    WaitTimeout,
    WorkflowFailed,
)
from cdiflow.client.models import (
    ActiveTaskRun,
    CdiDirectory,
    Definition,
    DefinitionVersion,
    Delivery,
    DeliveryPage,
    Event,
    EventPage,
    Handoff,
    Identity,
    Key,
    KeyCreated,
    Liveness,
    Readiness,
    Retention,
    Schedule,
    Stats,
    Step,
    Task,
    TaskRun,
    TaskRunInWorkflow,
    Upload,
    Webhook,
    WebhookCreated,
    Worker,
    Workflow,
    WorkflowDetail,
    WorkflowImages,
    WorkflowPage,
    as_data,
)
from cdiflow.client.sync import Client

__all__ = [
    "APIError",
    "ActiveTaskRun",
    "AsyncClient",
    "CdiDirectory",
    "CdiflowError",
    "Client",
    "ConfigError",
    "Conflict",
    "Definition",
    "DefinitionVersion",
    "Delivery",
    "DeliveryPage",
    "Endpoint",
    "Event",
    "EventPage",
    "Forbidden",
    "Handoff",
    "Identity",
    "InvalidRequest",
    "Key",
    "KeyCreated",
    "Liveness",
    "NotFound",
    "Readiness",
    "RequestTooLarge",
    "Retention",
    "SavedResult",
    "Schedule",
    "ServiceUnavailable",
    "Stats",
    "Step",
    "Task",
    "TaskRun",
    "TaskRunInWorkflow",
    "TooManyRequests",
    "TransportError",
    "Unauthorized",
    "Upload",
    "WaitTimeout",
    "Webhook",
    "WebhookCreated",
    "Worker",
    "Workflow",
    "WorkflowDetail",
    "WorkflowFailed",
    "WorkflowImages",
    "WorkflowPage",
    "as_data",
    "resolve",
]
