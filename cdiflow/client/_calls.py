"""The requests behind every verb, shared by the sync and the async client: each verb is a
``Call`` (method, path, parameters, body, and how to read the answer), which the clients send
with httpx and parse the same way."""

from __future__ import annotations

import mimetypes
import os
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import IO, Any, Final, Generic, TypeAlias, TypeVar

import httpx
from pydantic import TypeAdapter, ValidationError

from cdiflow.client.errors import (
    CdiflowError,
    ConfigError,
    TooManyRequests,
    TransportError,
    WaitTimeout,
    WorkflowFailed,
    api_error,
)
from cdiflow.client.models import (
    Definition,
    DefinitionVersion,
    EventPage,
    Task,
    Upload,
    Worker,
    Workflow,
    WorkflowDetail,
    WorkflowPage,
)

__all__ = [
    "BUSY_TIMEOUT_S",
    "Call",
    "Calls",
    "ImageSource",
    "WaitClock",
    "as_image_source",
    "busy_delay",
    "parse_response",
]

T = TypeVar("T")
RunId: TypeAlias = "str | uuid.UUID"
# A local file (path), its bytes, an open binary file, or an s3:// URI (a str starting s3://).
ImageSource: TypeAlias = "str | os.PathLike[str] | bytes | IO[bytes]"

MAX_WAIT_S: Final = 55.0  # a long poll's wait; the API answers within 60 s
CONNECT_TIMEOUT_S: Final = 10.0
READ_TIMEOUT_S: Final = 60.0  # transfers and ordinary answers
BUSY_TIMEOUT_S: Final = 60.0  # how long a request the API answers 429 is sent again
DEFAULT_RETRY_AFTER_S: Final = 1.0  # a 429 without a usable Retry-After


@dataclass(frozen=True)
class Call(Generic[T]):
    """One request and how to read its answer."""

    method: str
    path: str
    parse: Callable[[Any], T]
    params: Mapping[str, Any] | None = None
    json: Any = None
    files: Mapping[str, tuple[str, bytes, str]] | None = None
    wait_s: float = 0.0  # the server may hold the answer this long (a long poll)
    raw: bool = False  # the answer is bytes, not JSON

    @property
    def timeout(self) -> httpx.Timeout:
        return httpx.Timeout(READ_TIMEOUT_S + self.wait_s, connect=CONNECT_TIMEOUT_S)


def _model(adapter: TypeAdapter[T]) -> Callable[[Any], T]:
    return adapter.validate_python


def _nothing(_body: Any) -> None:
    return None


_TASK = _model(TypeAdapter(Task))
_TASKS = _model(TypeAdapter(list[Task]))
_DEFINITION = _model(TypeAdapter(Definition))
_DEFINITIONS = _model(TypeAdapter(list[Definition]))
_VERSIONS = _model(TypeAdapter(list[DefinitionVersion]))
_VERSION = _model(TypeAdapter(DefinitionVersion))
_UPLOAD = _model(TypeAdapter(Upload))
_WORKFLOW = _model(TypeAdapter(Workflow))
_DETAIL = _model(TypeAdapter(WorkflowDetail))
_PAGE = _model(TypeAdapter(WorkflowPage))
_EVENTS = _model(TypeAdapter(EventPage))
_WORKERS = _model(TypeAdapter(list[Worker]))


def _given(**values: Any) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


class Calls:
    """Builds the ``Call`` of each verb; the clients' methods of the same names send them."""

    # -- tasks -------------------------------------------------------------------------
    def register_task(
        self,
        name: str,
        module: str,
        *,
        timeout_s: float | None = None,
        retries: int | None = None,
        retry_backoff_s: float | None = None,
        description: str | None = None,
    ) -> Call[Task]:
        body = _given(
            name=name,
            module=module,
            timeout_s=timeout_s,
            retries=retries,
            retry_backoff_s=retry_backoff_s,
            description=description,
        )
        return Call("PUT", f"/api/tasks/{_segment(name)}", _TASK, json=body)

    def tasks(self) -> Call[list[Task]]:
        return Call("GET", "/api/tasks", _TASKS)

    def task(self, name: str) -> Call[Task]:
        return Call("GET", f"/api/tasks/{_segment(name)}", _TASK)

    def delete_task(self, name: str) -> Call[None]:
        return Call("DELETE", f"/api/tasks/{_segment(name)}", _nothing)

    # -- workflow definitions ------------------------------------------------------------
    def apply_definition(self, definition: Mapping[str, Any]) -> Call[Definition]:
        name = definition.get("name")
        if not isinstance(name, str) or not name:
            raise ConfigError('a workflow definition needs a "name"')
        path = f"/api/workflow-definitions/{_segment(name)}"
        return Call("PUT", path, _DEFINITION, json=dict(definition))

    def definitions(self) -> Call[list[Definition]]:
        return Call("GET", "/api/workflow-definitions", _DEFINITIONS)

    def definition(self, name: str) -> Call[Definition]:
        return Call("GET", f"/api/workflow-definitions/{_segment(name)}", _DEFINITION)

    def definition_versions(self, name: str) -> Call[list[DefinitionVersion]]:
        return Call("GET", f"/api/workflow-definitions/{_segment(name)}/versions", _VERSIONS)

    def definition_version(self, name: str, version: int) -> Call[DefinitionVersion]:
        path = f"/api/workflow-definitions/{_segment(name)}/versions/{int(version)}"
        return Call("GET", path, _VERSION)

    def delete_definition(self, name: str) -> Call[None]:
        return Call("DELETE", f"/api/workflow-definitions/{_segment(name)}", _nothing)

    # -- inputs and runs ---------------------------------------------------------------------
    def upload(
        self, image: bytes | str | os.PathLike[str] | IO[bytes], filename: str | None = None
    ) -> Call[Upload]:
        name, data = _read_image(image, filename)
        content_type = mimetypes.guess_type(name)[0] or "application/octet-stream"
        return Call("POST", "/api/inputs", _UPLOAD, files={"file": (name, data, content_type)})

    def start(
        self,
        workflow: str,
        image_uri: str | None,
        *,
        data: Mapping[str, Any] | None = None,
        policy: str | None = None,
        data_plane: str | None = None,
        result_format: str | None = None,
        version: int | None = None,
    ) -> Call[Workflow]:
        given = _given(
            image=image_uri, data=dict(data) if data else None, result_format=result_format
        )
        body = {
            "workflow": workflow,
            "input": given,
            **_given(policy=policy, data_plane=data_plane, version=version),
        }
        return Call("POST", "/api/workflows", _WORKFLOW, json=body)

    def get(
        self, workflow_id: RunId, *, wait_s: float = 0.0, events: int = 100
    ) -> Call[WorkflowDetail]:
        params = {"events": events, **({"wait_s": round(wait_s, 3)} if wait_s > 0 else {})}
        return Call("GET", f"/api/workflows/{_run(workflow_id)}", _DETAIL, params, wait_s=wait_s)

    def list_workflows(
        self,
        *,
        status: str | None = None,
        workflow: str | None = None,
        policy: str | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> Call[WorkflowPage]:
        params = _given(status=status, workflow=workflow, policy=policy, limit=limit, offset=offset)
        return Call("GET", "/api/workflows", _PAGE, params)

    def events_after(self, workflow_id: RunId, after: int) -> Call[EventPage]:
        params = {"after": after}
        return Call("GET", f"/api/workflows/{_run(workflow_id)}/events", _EVENTS, params)

    def cancel(self, workflow_id: RunId) -> Call[Workflow]:
        return Call("POST", f"/api/workflows/{_run(workflow_id)}/cancel", _WORKFLOW)

    def retry(self, workflow_id: RunId) -> Call[Workflow]:
        return Call("POST", f"/api/workflows/{_run(workflow_id)}/retry", _WORKFLOW)

    def result(self, workflow_id: RunId) -> Call[bytes]:
        path = f"/api/workflows/{_run(workflow_id)}/result"
        return Call("GET", path, bytes, raw=True)

    def workers(self) -> Call[list[Worker]]:
        return Call("GET", "/api/workers", _WORKERS)


def busy_delay(response: httpx.Response, waited_s: float, budget_s: float) -> float | None:
    """Seconds to wait before sending a request again that the API answered ``response``: its
    ``Retry-After`` for a 429 (the API is at capacity and did nothing with the request), as
    long as ``waited_s`` so far plus that stays within ``budget_s``; ``None``: take the answer
    as it is (always with a ``budget_s`` of 0)."""
    if response.status_code != 429 or budget_s <= 0:
        return None
    delay = retry_after_s(response)
    return delay if waited_s + delay <= budget_s else None


def retry_after_s(response: httpx.Response) -> float:
    """The response's ``Retry-After`` in seconds (RFC 9110: seconds, or an HTTP date)."""
    value = response.headers.get("Retry-After", "").strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return DEFAULT_RETRY_AFTER_S
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def parse_response(call: Call[T], response: httpx.Response) -> T:
    """The answer of ``call`` read from ``response``: its model, or the error it is."""
    if response.is_error:
        try:
            body: Any = response.json()
        except ValueError:
            body = None
        fallback = f"{call.method} {call.path}: HTTP {response.status_code} {response.text[:200]}"
        error = api_error(response.status_code, body, fallback)
        if isinstance(error, TooManyRequests):
            error.retry_after_s = retry_after_s(response)
        raise error
    if call.raw:
        return call.parse(response.content)
    if response.status_code == 204 or not response.content:
        return call.parse(None)
    try:
        return call.parse(response.json())
    except (ValueError, ValidationError) as exc:
        raise CdiflowError(
            f"{call.method} {call.path} answered something this client cannot read ({exc}); "
            "is the address a cdiflow API of a matching version?"
        ) from exc


def transport_error(url: str, exc: httpx.TransportError) -> TransportError:
    return TransportError(
        f"cannot reach the cdiflow API at {url} ({type(exc).__name__}: {exc}); is the stack "
        "up (`cdiflow status`) and is the address right (api_url= or $CDIFLOW_API_URL)?"
    )


def as_image_source(image: ImageSource | None) -> tuple[str | None, ImageSource | None]:
    """``(uri, None)`` for an ``s3://`` URI (or ``None``: a dataless run), ``(None, image)``
    for something to upload first."""
    if image is None:
        return None, None
    if isinstance(image, str) and image.startswith("s3://"):
        return image, None
    return None, image


@dataclass
class WaitClock:
    """How long each long poll of a wait may take, and when the wait is over."""

    workflow_id: str
    timeout: float | None
    started: float = field(default_factory=time.monotonic)

    def next_wait(self) -> float:
        if self.timeout is None:
            return MAX_WAIT_S
        return max(0.0, min(MAX_WAIT_S, self.started + self.timeout - time.monotonic()))

    def settle(self, detail: WorkflowDetail, check: bool) -> WorkflowDetail | None:
        """``detail`` once the run has finished (``WorkflowFailed`` if ``check`` and it did not
        complete); ``None`` to ask again; ``WaitTimeout`` once the time is up."""
        if detail.finished:
            if check and detail.status != "COMPLETED":
                raise WorkflowFailed(detail)
            return detail
        if self.timeout is not None and time.monotonic() - self.started >= self.timeout:
            raise WaitTimeout(self.workflow_id, self.timeout)
        return None


def _read_image(
    image: bytes | str | os.PathLike[str] | IO[bytes], filename: str | None
) -> tuple[str, bytes]:
    if isinstance(image, bytes):
        return filename or "input", image
    if isinstance(image, str | os.PathLike):
        path = Path(image)
        try:
            return filename or path.name, path.read_bytes()
        except OSError as exc:
            raise ConfigError(f"cannot read the image {path}: {exc.strerror or exc}") from exc
    data = image.read()
    name = filename or Path(str(getattr(image, "name", "input"))).name
    return name, data


def _segment(value: str) -> str:
    if not value or "/" in value:
        raise ConfigError(f"{value!r} is not a name the API knows (no '/', not empty)")
    return value


def _run(workflow_id: RunId) -> str:
    try:
        return str(uuid.UUID(str(workflow_id)))
    except ValueError:
        raise ConfigError(f"{workflow_id!r} is not a workflow run id (a UUID)") from None
