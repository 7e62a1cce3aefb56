"""The requests behind every verb, shared by the sync and the async client: each verb is a
``Call`` (method, path, parameters, body, and how to read the answer), which the clients send
with httpx and parse the same way."""

from __future__ import annotations

import json
import math
import mimetypes
import os
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import IO, Any, Final, Generic, TypeAlias, TypeVar, cast
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ValidationError

from cdiflow.client.errors import (
    CdiflowError,
    ConfigError,
    NotFound,
    TooManyRequests,
    TransportError,
    WaitTimeout,
    WorkflowFailed,
    api_error,
)
from cdiflow.client.models import (
    ActiveTaskRun,
    CdiDirectory,
    Definition,
    DefinitionVersion,
    DeliveryPage,
    EventPage,
    Identity,
    Key,
    KeyCreated,
    Liveness,
    Readiness,
    Retention,
    Schedule,
    Stats,
    Task,
    TaskRunInWorkflow,
    Upload,
    Webhook,
    WebhookCreated,
    Worker,
    Workflow,
    WorkflowDetail,
    WorkflowImages,
    WorkflowPage,
    definition_body,
    read,
)
from orchestrator.contract.vocabulary import WorkflowStatus

__all__ = [
    "BUSY_TIMEOUT_S",
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_MAX_WAITS",
    "Call",
    "Calls",
    "FileSource",
    "ImageSource",
    "Pools",
    "SavedResult",
    "WaitClock",
    "as_image_source",
    "busy_delay",
    "parse_response",
]

T = TypeVar("T")
RunId: TypeAlias = "str | uuid.UUID"
# A local file (path), its bytes, an open binary file, or an s3:// URI (a str starting s3://).
FileSource: TypeAlias = "str | os.PathLike[str] | bytes | IO[bytes]"
ImageSource: TypeAlias = FileSource

IDEMPOTENCY_HEADER: Final = "Idempotency-Key"
MAX_WAIT_S: Final = 55.0  # a long poll's wait; the API answers within 60 s
CONNECT_TIMEOUT_S: Final = 10.0
READ_TIMEOUT_S: Final = 60.0  # transfers and ordinary answers
BUSY_TIMEOUT_S: Final = 60.0  # how long a request the API answers 429 is sent again
DEFAULT_RETRY_AFTER_S: Final = 1.0  # a 429 without a usable Retry-After
DEFAULT_MAX_CONNECTIONS: Final = 100  # httpx's own default, for every call but long polls
# Long polls in flight at once; each holds a connection (a file descriptor) while it waits,
# and more wait their turn for one (up to a poll's timeout), never for the other calls' pool.
DEFAULT_MAX_WAITS: Final = 500


@dataclass(frozen=True)
class Pools:
    """The connection limits of the two pools a client keeps: ``calls`` for every request but
    long polls, ``waits`` for long polls alone. *Why two:* a long poll holds its connection
    for up to a minute; sharing one pool, a caller with more waits open than connections had
    its starts, uploads and reads queue behind them."""

    calls: httpx.Limits
    waits: httpx.Limits

    @classmethod
    def sized(cls, max_connections: int, max_waits: int) -> Pools:
        for name, value in (("max_connections", max_connections), ("max_waits", max_waits)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a positive number of connections, not {value!r}")
        return cls(
            calls=httpx.Limits(
                max_connections=max_connections,
                max_keepalive_connections=min(20, max_connections),
            ),
            # Every idle wait connection is kept: the next poll of the same wait reuses it.
            waits=httpx.Limits(max_connections=max_waits, max_keepalive_connections=max_waits),
        )


@dataclass(frozen=True)
class SavedResult:
    """A result written to a file: where, how many bytes, and its content type."""

    path: Path
    bytes: int
    content_type: str


@dataclass(frozen=True)
class Call(Generic[T]):
    """One request and what its answer is: ``model`` (an ``orchestrator.schemas`` model, a
    ``list[...]`` or union of them), ``bytes`` for a file, ``None`` for no body."""

    method: str
    path: str
    model: Any
    params: Mapping[str, Any] | None = None
    json: Any = None
    files: Mapping[str, tuple[str, bytes, str]] | None = None
    wait_s: float = 0.0  # the server may hold the answer this long (a long poll)
    answers_with: frozenset[int] = frozenset()  # error statuses whose body is the answer too
    headers: Mapping[str, str] | None = None

    @property
    def timeout(self) -> httpx.Timeout:
        # A long poll waits its turn for a connection of the waits' pool however long it takes
        # (each one there is freed within a poll): more waits than ``max_waits`` take turns
        # instead of failing with a pool timeout.
        pool = None if self.wait_s > 0 else READ_TIMEOUT_S
        return httpx.Timeout(READ_TIMEOUT_S + self.wait_s, connect=CONNECT_TIMEOUT_S, pool=pool)

    def parse(self, body: Any) -> T:
        """The answer read from ``body`` (bytes for a file, else JSON as parsed)."""
        if self.model is None:
            return cast(T, None)
        if self.model is bytes:
            return cast(T, body)
        return cast(T, read(self.model, body))


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
        create: bool = False,
        max_concurrency: int | None = None,
    ) -> Call[Task]:
        body = _given(
            name=name,
            module=module,
            timeout_s=timeout_s,
            retries=retries,
            retry_backoff_s=retry_backoff_s,
            description=description,
            max_concurrency=max_concurrency,
        )
        if create:
            return Call("POST", "/api/tasks", Task, json=body)
        return Call("PUT", f"/api/tasks/{_segment(name)}", Task, json=body)

    def tasks(self) -> Call[list[Task]]:
        return Call("GET", "/api/tasks", list[Task])

    def task(self, name: str) -> Call[Task]:
        return Call("GET", f"/api/tasks/{_segment(name)}", Task)

    def delete_task(self, name: str) -> Call[None]:
        return Call("DELETE", f"/api/tasks/{_segment(name)}", None)

    # -- workflow definitions ------------------------------------------------------------
    def apply_definition(
        self, definition: Mapping[str, Any] | BaseModel, *, create: bool = False
    ) -> Call[Definition]:
        body = definition_body(definition)
        name = body.get("name")
        if not isinstance(name, str) or not name:
            raise ConfigError('a workflow definition needs a "name"')
        if create:
            return Call("POST", "/api/workflow-definitions", Definition, json=body)
        path = f"/api/workflow-definitions/{_segment(name)}"
        return Call("PUT", path, Definition, json=body)

    def definitions(self) -> Call[list[Definition]]:
        return Call("GET", "/api/workflow-definitions", list[Definition])

    def definition(self, name: str) -> Call[Definition]:
        return Call("GET", f"/api/workflow-definitions/{_segment(name)}", Definition)

    def definition_versions(self, name: str) -> Call[list[DefinitionVersion]]:
        path = f"/api/workflow-definitions/{_segment(name)}/versions"
        return Call("GET", path, list[DefinitionVersion])

    def definition_version(self, name: str, version: int) -> Call[DefinitionVersion]:
        path = f"/api/workflow-definitions/{_segment(name)}/versions/{int(version)}"
        return Call("GET", path, DefinitionVersion)

    def delete_definition(self, name: str) -> Call[None]:
        return Call("DELETE", f"/api/workflow-definitions/{_segment(name)}", None)

    def pause_definition(self, name: str, *, paused: bool = True) -> Call[Definition]:
        verb = "pause" if paused else "resume"
        path = f"/api/workflow-definitions/{_segment(name)}/{verb}"
        return Call("POST", path, Definition)

    def set_retention(
        self, name: str, *, days: int | None = None, results: str | None = None
    ) -> Call[Definition]:
        path = f"/api/workflow-definitions/{_segment(name)}/retention"
        return Call("PUT", path, Definition, json={"days": days, "results": results})

    def retention(self) -> Call[Retention]:
        return Call("GET", "/api/retention", Retention)

    # -- inputs and runs ---------------------------------------------------------------------
    def upload(self, file: FileSource, filename: str | None = None) -> Call[Upload]:
        name, data = _read_file(file, filename)
        content_type = mimetypes.guess_type(name)[0] or "application/octet-stream"
        return Call("POST", "/api/inputs", Upload, files={"file": (name, data, content_type)})

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
        priority: int | None = None,
        tags: Sequence[str] | None = None,
        idempotency_key: str | None = None,
        timeout_s: float | None = None,
        wait_s: float = 0.0,
    ) -> Call[Workflow]:
        given = _given(
            image=image_uri, data=dict(data) if data else None, result_format=result_format
        )
        body = {
            "workflow": workflow,
            "input": given,
            **_given(
                policy=policy,
                data_plane=data_plane,
                version=version,
                priority=priority,
                timeout_s=timeout_s,
            ),
            **({"tags": list(tags)} if tags else {}),
        }
        # Every start carries a key (the caller's, or one made here), so one whose connection
        # closed unanswered is sent again safely: the API answers the run the first one started.
        headers = {IDEMPOTENCY_HEADER: idempotency_key or str(uuid.uuid4())}
        # The API answers the new run; asked to wait (``wait_s``), its detail once it has ended
        # or the wait is over.
        params = {"wait_s": round(wait_s, 3)} if wait_s > 0 else None
        return Call(
            "POST", "/api/workflows", WorkflowDetail | Workflow, params, json=body,
            headers=headers, wait_s=wait_s,
        )  # fmt: skip

    def get(
        self, workflow_id: RunId, *, wait_s: float = 0.0, events: int = 100
    ) -> Call[WorkflowDetail]:
        params = {"events": events, **({"wait_s": round(wait_s, 3)} if wait_s > 0 else {})}
        path = f"/api/workflows/{_run(workflow_id)}"
        return Call("GET", path, WorkflowDetail, params, wait_s=wait_s)

    def list_workflows(
        self,
        *,
        status: str | None = None,
        workflow: str | None = None,
        policy: str | None = None,
        tags: Sequence[str] | None = None,
        input: Mapping[str, Any] | None = None,
        schedule: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
        offset: int | None = None,
    ) -> Call[WorkflowPage]:
        params = _given(
            status=status,
            workflow=workflow,
            policy=policy,
            tag=list(tags) if tags else None,
            input=json.dumps(dict(input)) if input is not None else None,
            schedule=schedule,
            limit=limit,
            cursor=cursor,
            offset=offset,
        )
        return Call("GET", "/api/workflows", WorkflowPage, params)

    def events_after(self, workflow_id: RunId, after: int) -> Call[EventPage]:
        params = {"after": after}
        return Call("GET", f"/api/workflows/{_run(workflow_id)}/events", EventPage, params)

    def cancel(self, workflow_id: RunId) -> Call[Workflow]:
        return Call("POST", f"/api/workflows/{_run(workflow_id)}/cancel", Workflow)

    def retry(self, workflow_id: RunId) -> Call[Workflow]:
        return Call("POST", f"/api/workflows/{_run(workflow_id)}/retry", Workflow)

    def pause(self, workflow_id: RunId, *, paused: bool = True) -> Call[Workflow]:
        verb = "pause" if paused else "resume"
        return Call("POST", f"/api/workflows/{_run(workflow_id)}/{verb}", Workflow)

    # -- schedules ---------------------------------------------------------------------------
    def create_schedule(
        self, name: str, workflow: str, cron: str, **settings: Any
    ) -> Call[Schedule]:
        body = {"name": name, "workflow": workflow, "cron": cron, **_given(**settings)}
        return Call("POST", "/api/schedules", Schedule, json=body)

    def schedules(self, workflow: str | None = None) -> Call[list[Schedule]]:
        return Call("GET", "/api/schedules", list[Schedule], _given(workflow=workflow))

    def schedule(self, name: str) -> Call[Schedule]:
        return Call("GET", f"/api/schedules/{_segment(name)}", Schedule)

    def pause_schedule(self, name: str, *, paused: bool = True) -> Call[Schedule]:
        verb = "pause" if paused else "resume"
        return Call("POST", f"/api/schedules/{_segment(name)}/{verb}", Schedule)

    def delete_schedule(self, name: str) -> Call[None]:
        return Call("DELETE", f"/api/schedules/{_segment(name)}", None)

    # -- webhooks ----------------------------------------------------------------------------
    def create_webhook(
        self,
        name: str,
        url: str,
        *,
        events: Sequence[str] | None = None,
        workflow: str | None = None,
        secret: str | None = None,
    ) -> Call[WebhookCreated]:
        body = {"name": name, "url": url, **_given(workflow=workflow, secret=secret)}
        if events:
            body["events"] = list(events)
        return Call("POST", "/api/webhooks", WebhookCreated, json=body)

    def webhooks(self) -> Call[list[Webhook]]:
        return Call("GET", "/api/webhooks", list[Webhook])

    def webhook(self, name: str) -> Call[Webhook]:
        return Call("GET", f"/api/webhooks/{_segment(name)}", Webhook)

    def delete_webhook(self, name: str) -> Call[None]:
        return Call("DELETE", f"/api/webhooks/{_segment(name)}", None)

    def deliveries(
        self,
        name: str,
        *,
        status: str | None = None,
        limit: int = 50,
        before_id: int | None = None,
        offset: int | None = None,
    ) -> Call[DeliveryPage]:
        params = _given(status=status, limit=limit, before_id=before_id, offset=offset)
        return Call("GET", f"/api/webhooks/{_segment(name)}/deliveries", DeliveryPage, params)

    def result(self, workflow_id: RunId, output: str | None = None) -> Call[bytes]:
        """The run's image result, or its result ``output`` (``step.output``)."""
        if output is None:
            return Call("GET", f"/api/workflows/{_run(workflow_id)}/result", bytes)
        if not output or output.startswith("/") or "." not in output:
            raise ConfigError(
                f"{output!r} is not a result name; name one as its run lists it, step.output "
                "(e.g. combine.video)"
            )
        path = f"/api/workflows/{_run(workflow_id)}/results/{quote(output, safe='/[]')}"
        return Call("GET", path, bytes)

    def images(self, workflow_id: RunId) -> Call[WorkflowImages]:
        return Call("GET", f"/api/workflows/{_run(workflow_id)}/images", WorkflowImages)

    def thumbnail(self, workflow_id: RunId, role: str) -> Call[bytes]:
        return Call("GET", f"/api/workflows/{_run(workflow_id)}/images/{_segment(role)}", bytes)

    # -- task runs, workers, the CDI directory, statistics ---------------------------------
    def active_task_runs(
        self, *, worker: str | None = None, workflow: RunId | None = None, limit: int = 200
    ) -> Call[list[ActiveTaskRun]]:
        run = None if workflow is None else _run(workflow)
        params = _given(worker=worker, workflow=run, limit=limit)
        return Call("GET", "/api/task-runs/active", list[ActiveTaskRun], params)

    def task_runs(
        self,
        finished_after: datetime,
        started_before: datetime,
        *,
        after_id: int = 0,
        limit: int = 200,
    ) -> Call[list[TaskRunInWorkflow]]:
        params = {
            "finished_after": finished_after.isoformat(),
            "started_before": started_before.isoformat(),
            "after_id": after_id,
            "limit": limit,
        }
        return Call("GET", "/api/task-runs", list[TaskRunInWorkflow], params)

    def workers(self) -> Call[list[Worker]]:
        return Call("GET", "/api/workers", list[Worker])

    def cdi_objects(self) -> Call[CdiDirectory]:
        return Call("GET", "/api/cdi/objects", CdiDirectory)

    def stats(self, *, window_minutes: int = 15) -> Call[Stats]:
        return Call("GET", "/api/stats", Stats, {"window_minutes": window_minutes})

    # -- API keys and health ---------------------------------------------------------------
    def whoami(self) -> Call[Identity]:
        return Call("GET", "/api/whoami", Identity)

    def keys(self) -> Call[list[Key]]:
        return Call("GET", "/api/keys", list[Key])

    def create_key(self, name: str, role: str | None = None) -> Call[KeyCreated]:
        return Call("POST", "/api/keys", KeyCreated, json=_given(name=name, role=role))

    def revoke_key(self, key_id: str | uuid.UUID) -> Call[None]:
        try:
            key = uuid.UUID(str(key_id))
        except ValueError:
            raise ConfigError(f"{key_id!r} is not an API key id (a UUID)") from None
        return Call("DELETE", f"/api/keys/{key}", None)

    def health(self) -> Call[Liveness]:
        return Call("GET", "/api/healthz", Liveness)

    def readiness(self, scope: str | None = None) -> Call[Readiness]:
        # 503 answers the same body, saying which part is not ready.
        return Call("GET", "/api/readyz", Readiness, params=_given(scope=scope),
                    answers_with=frozenset({503}))  # fmt: skip


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
    if response.is_error and response.status_code not in call.answers_with:
        try:
            body: Any = response.json()
        except ValueError:
            body = None
        fallback = f"{call.method} {call.path}: HTTP {response.status_code} {response.text[:200]}"
        error = api_error(response.status_code, body, fallback)
        if isinstance(error, TooManyRequests):
            error.retry_after_s = retry_after_s(response)
        raise error
    if call.model is bytes:
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


RESENDS: Final = 2  # times a call whose connection was closed unanswered is sent again


def resend_delay(call: Call[Any], exc: httpx.TransportError, attempt: int) -> float | None:
    """Seconds to pause before sending ``call`` again after its ``attempt``-th try (from 1)
    failed with ``exc``, or ``None`` to give up. Only a call that may be sent twice (a GET, or
    one with an idempotency key: every start) whose connection the server closed without an
    answer: a kept-alive connection the server closed just as it was reused, or one dropped
    under load. A refused connection (the API is down) is said at once."""
    closed = isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError)
    repeatable = call.method == "GET" or IDEMPOTENCY_HEADER in (call.headers or {})
    if not repeatable or not closed or attempt > RESENDS:
        return None
    return 0.1 * attempt


def transport_error(url: str, exc: httpx.TransportError) -> TransportError:
    return TransportError(
        f"cannot reach the cdiflow API at {url} ({type(exc).__name__}: {exc}); is the stack "
        "up (`cdiflow status`) and is the address right (api_url= or $CDIFLOW_API_URL)?"
    )


def as_image_source(image: FileSource | None) -> tuple[str | None, FileSource | None]:
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
        return min(MAX_WAIT_S, self.left())

    def left(self) -> float:
        """Seconds until the wait is over (``inf`` without a timeout)."""
        if self.timeout is None:
            return math.inf
        return max(0.0, self.started + self.timeout - time.monotonic())

    def over(self) -> bool:
        return self.left() <= 0.0

    def settle(self, detail: WorkflowDetail, check: bool) -> WorkflowDetail | None:
        """``detail`` once the run has finished (``WorkflowFailed`` if ``check`` and it did not
        complete); ``None`` to ask again; ``WaitTimeout`` once the time is up."""
        if detail.finished:
            if check and detail.status != WorkflowStatus.COMPLETED:
                raise WorkflowFailed(detail)
            return detail
        if self.timeout is not None and self.over():
            raise WaitTimeout(self.workflow_id, self.timeout)
        return None


def the_only_result(output: str | None, missing: NotFound) -> str:
    """The result to download when a run without an image result was asked for its image
    result: its only stored result; else ``missing``, which lists them."""
    # A long list output is offered as one range ("step.output[0..n-1]"), not a result.
    if output is None and len(missing.known) == 1 and ".." not in missing.known[0]:
        return missing.known[0]
    raise missing


def _read_file(file: FileSource, filename: str | None) -> tuple[str, bytes]:
    if isinstance(file, bytes):
        return filename or "input", file
    if isinstance(file, str | os.PathLike):
        path = Path(file)
        try:
            return filename or path.name, path.read_bytes()
        except OSError as exc:
            raise ConfigError(f"cannot read the file {path}: {exc.strerror or exc}") from exc
    data = file.read()
    name = filename or Path(str(getattr(file, "name", "input"))).name
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
