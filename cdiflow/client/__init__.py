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

Every verb of the REST API is a method: tasks (``register_task``, ``tasks``, ...), workflow
definitions (``apply_definition``, ``definition_versions``, ``delete_definition``, ...), inputs
(``upload``), runs (``start``, ``wait``, ``run``, ``events``, ``download_result``,
``list_workflows``, ``cancel``, ``retry``) and ``workers``. Errors come from one tree,
``cdiflow.client.errors``, mapped from the API's error codes.
"""

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
    Definition,
    DefinitionVersion,
    Event,
    Handoff,
    Step,
    Task,
    TaskRun,
    Upload,
    Worker,
    Workflow,
    WorkflowDetail,
    WorkflowPage,
)
from cdiflow.client.sync import Client

__all__ = [
    "APIError",
    "AsyncClient",
    "CdiflowError",
    "Client",
    "ConfigError",
    "Conflict",
    "Definition",
    "DefinitionVersion",
    "Endpoint",
    "Event",
    "Forbidden",
    "Handoff",
    "InvalidRequest",
    "NotFound",
    "RequestTooLarge",
    "ServiceUnavailable",
    "Step",
    "Task",
    "TaskRun",
    "TooManyRequests",
    "TransportError",
    "Unauthorized",
    "Upload",
    "WaitTimeout",
    "Worker",
    "Workflow",
    "WorkflowDetail",
    "WorkflowFailed",
    "WorkflowPage",
    "resolve",
]
