"""``Client``: the cdiflow API from Python, blocking (see ``AsyncClient`` for asyncio).

    from cdiflow.client import Client

    with Client() as api:  # finds the local stack, or $CDIFLOW_API_URL
        run = api.run("image_pipeline", "photo.jpg")  # upload, start, wait
        api.download_result(run.id, "result.png")

Every method sends one request (``wait``, ``run`` and ``events`` several) and raises from
``cdiflow.client.errors``.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar

import httpx
from pydantic import BaseModel

from cdiflow.client._calls import (
    BUSY_TIMEOUT_S,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_WAITS,
    Call,
    Calls,
    FileSource,
    ImageSource,
    Pools,
    RunId,
    SavedResult,
    WaitClock,
    as_image_source,
    busy_delay,
    parse_response,
    resend_delay,
    the_only_result,
    transport_error,
)
from cdiflow.client.config import Endpoint, resolve
from cdiflow.client.errors import NotFound
from cdiflow.client.models import (
    ActiveTaskRun,
    CdiDirectory,
    Definition,
    DefinitionVersion,
    DeliveryPage,
    Event,
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
    has_ended,
)

__all__ = ["Client"]

T = TypeVar("T")


class Client:
    """Every verb of the cdiflow API; errors are the ``cdiflow.client.errors`` tree.

    ``api_url`` and ``api_key`` default to ``$CDIFLOW_API_URL`` / ``$CDIFLOW_API_KEY``, then to
    the stack ``cdiflow up`` runs from ``data_dir`` (``$CDIFLOW_DATA_DIR``, ``./.data``); see
    ``cdiflow.client.config``. Use it as a context manager, or ``close()`` it.

    Connections come from two pools: at most ``max_connections`` for every call but waits,
    and at most ``max_waits`` for the long polls of ``wait`` and ``run`` (each holds one while
    it waits), so waits never hold up starts, uploads or reads. A ``transport`` replaces both
    pools (it is its own).

    A request the API answers 429 (at capacity: it did nothing with it) is sent again after
    the ``Retry-After`` the API gives, for up to ``busy_timeout`` seconds in all; then, or at
    once with ``busy_timeout=0``, it raises ``TooManyRequests``.
    """

    def __init__(
        self,
        api_url: str | None = None,
        *,
        api_key: str | None = None,
        data_dir: str | Path | None = None,
        transport: httpx.BaseTransport | None = None,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        max_waits: int = DEFAULT_MAX_WAITS,
        busy_timeout: float = BUSY_TIMEOUT_S,
    ) -> None:
        self.endpoint: Endpoint = resolve(api_url, api_key, data_dir)
        self.busy_timeout = busy_timeout
        pools = Pools.sized(max_connections, max_waits)
        headers = {"Accept": "application/json"}
        if self.endpoint.key:
            headers["Authorization"] = f"Bearer {self.endpoint.key}"
        self._http = httpx.Client(
            base_url=self.endpoint.url, headers=headers, transport=transport, limits=pools.calls
        )
        self._waits = httpx.Client(
            base_url=self.endpoint.url, headers=headers, transport=transport, limits=pools.waits
        )
        self._calls = Calls()

    @property
    def api_url(self) -> str:
        return self.endpoint.url

    def close(self) -> None:
        for pool in (self._http, self._waits):
            pool.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _send(self, call: Call[T]) -> T:
        pool = self._waits if call.wait_s > 0 else self._http
        waited = 0.0
        tries = 0
        while True:
            tries += 1
            try:
                response = pool.request(
                    call.method,
                    call.path,
                    params=call.params,
                    json=call.json,
                    files=call.files,
                    headers=call.headers,
                    timeout=call.timeout,
                )
            except httpx.TransportError as exc:
                pause = resend_delay(call, exc, tries)
                if pause is None:
                    raise transport_error(self.api_url, exc) from exc
                time.sleep(pause)
                continue
            delay = busy_delay(response, waited, self.busy_timeout)
            if delay is None:
                return parse_response(call, response)
            time.sleep(delay)
            waited += delay

    # -- tasks ---------------------------------------------------------------------------
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
    ) -> Task:
        """Register task ``name`` run by ``module`` (``package.module:function``), or replace
        it (with ``create``, ``Conflict`` if it exists). Settings left out come from the
        function's ``@task`` (else the API's defaults); ``max_concurrency``: at most this many
        runs of it at once over every scheduler."""
        call = self._calls.register_task(
            name,
            module,
            timeout_s=timeout_s,
            retries=retries,
            retry_backoff_s=retry_backoff_s,
            description=description,
            create=create,
            max_concurrency=max_concurrency,
        )
        return self._send(call)

    def tasks(self) -> list[Task]:
        """Every registered task, by name."""
        return self._send(self._calls.tasks())

    def task(self, name: str) -> Task:
        return self._send(self._calls.task(name))

    def delete_task(self, name: str) -> None:
        """Delete a task (``Conflict`` while a workflow definition uses it)."""
        self._send(self._calls.delete_task(name))

    # -- workflow definitions ----------------------------------------------------------------
    def apply_definition(
        self, definition: Mapping[str, Any] | BaseModel, *, create: bool = False
    ) -> Definition:
        """Save a workflow definition (``{"name", "description", "tasks": [...]}``, and the
        queue settings ``priority`` and ``max_concurrent_runs`` if given, or a ``Definition``
        read from the API): a new version when it differs from the current one, nothing when it
        does not. With ``create``, version 1 of a new name only (``Conflict`` if it exists)."""
        return self._send(self._calls.apply_definition(definition, create=create))

    def definitions(self) -> list[Definition]:
        return self._send(self._calls.definitions())

    def definition(self, name: str) -> Definition:
        return self._send(self._calls.definition(name))

    def definition_versions(self, name: str) -> list[DefinitionVersion]:
        """Every version of a workflow definition, newest first."""
        return self._send(self._calls.definition_versions(name))

    def definition_version(self, name: str, version: int) -> DefinitionVersion:
        return self._send(self._calls.definition_version(name, version))

    def delete_definition(self, name: str) -> None:
        """Delete a workflow definition (``Conflict`` while runs of it are pending or running)."""
        self._send(self._calls.delete_definition(name))

    def pause_definition(self, name: str) -> Definition:
        """Pause a definition's queue: its new runs wait PENDING; RUNNING ones go on."""
        return self._send(self._calls.pause_definition(name))

    def resume_definition(self, name: str) -> Definition:
        return self._send(self._calls.pause_definition(name, paused=False))

    # -- inputs and runs ---------------------------------------------------------------------
    def upload(self, file: FileSource, filename: str | None = None) -> Upload:
        """Store an input file (a path, bytes or an open binary file: an image, a video, a
        ``.npy`` array, ...) in the stack's bucket: its ``uri``, and the ``content_type`` the
        API found in its bytes."""
        return self._send(self._calls.upload(file, filename))

    def start(
        self,
        workflow: str,
        image: ImageSource | None = None,
        *,
        data: Mapping[str, Any] | None = None,
        files: Mapping[str, FileSource] | None = None,
        policy: str | None = None,
        data_plane: str | None = None,
        result_format: str | None = None,
        version: int | None = None,
        priority: int | None = None,
        tags: Sequence[str] | None = None,
        idempotency_key: str | None = None,
        timeout_s: float | None = None,
        wait_s: float = 0.0,
    ) -> Workflow:
        """Start a run of ``workflow`` on ``image``: an ``s3://`` URI, or a local file (path,
        bytes or open file) uploaded first; ``None`` starts a dataless run. ``data`` reaches
        every task as ``ctx.input``; each of ``files`` (a local file, uploaded first, or an
        ``s3://`` URI) goes into it under its name as its URI (``files={"video": "a.mp4"}``
        for ``ar_video``). ``version`` runs that version of the definition; ``priority``
        (-100..100, default the definition's) orders it among waiting runs; ``tags`` label it.
        With ``idempotency_key`` a start sent again (after a timeout, say) answers the run the
        first one started instead of starting another (without one, the client makes one, so a
        start whose connection closed unanswered is sent again safely). ``timeout_s`` is the
        run's time limit (past it, it ends TIMED_OUT), instead of the definition's. With
        ``wait_s`` (at most 60) the answer comes once the run has ended or that many seconds
        have passed, as its detail (a ``WorkflowDetail``): one request for a run expected to be
        short."""
        uri, local = as_image_source(image)
        if local is not None:
            uri = self.upload(local).uri
        named = dict(data or {})
        for name, source in (files or {}).items():
            named[name], local = as_image_source(source)
            if local is not None:
                named[name] = self.upload(local).uri
        call = self._calls.start(
            workflow,
            uri,
            data=named,
            policy=policy,
            data_plane=data_plane,
            result_format=result_format,
            version=version,
            priority=priority,
            tags=tags,
            idempotency_key=idempotency_key,
            timeout_s=timeout_s,
            wait_s=wait_s,
        )
        return self._send(call)

    def get(self, workflow_id: RunId, *, events: int = 100) -> WorkflowDetail:
        """A run with its task runs, hand-offs and latest ``events``."""
        return self._send(self._calls.get(workflow_id, events=events))

    def wait(
        self, workflow_id: RunId, timeout: float | None = None, *, check: bool = False
    ) -> WorkflowDetail:
        """The run's detail once it has finished (long polls: no busy loop). ``WaitTimeout``
        after ``timeout`` seconds; with ``check``, ``WorkflowFailed`` unless it completed."""
        clock = WaitClock(str(workflow_id), timeout)
        while True:
            detail = self._send(self._calls.get(workflow_id, wait_s=clock.next_wait()))
            if (settled := clock.settle(detail, check)) is not None:
                return settled

    def run(
        self,
        workflow: str,
        image: ImageSource | None = None,
        *,
        timeout: float | None = None,
        data: Mapping[str, Any] | None = None,
        files: Mapping[str, FileSource] | None = None,
        policy: str | None = None,
        data_plane: str | None = None,
        result_format: str | None = None,
        version: int | None = None,
        timeout_s: float | None = None,
    ) -> WorkflowDetail:
        """``start`` then ``wait(check=True)``: the completed run, or ``WorkflowFailed``.
        ``timeout`` bounds the wait (the run goes on), ``timeout_s`` the run itself."""
        started = self.start(
            workflow,
            image,
            data=data,
            files=files,
            policy=policy,
            data_plane=data_plane,
            result_format=result_format,
            version=version,
            timeout_s=timeout_s,
        )
        return self.wait(started.id, timeout, check=True)

    def events(
        self,
        workflow_id: RunId,
        *,
        follow: bool = True,
        poll_s: float = 0.5,
        timeout: float | None = None,
    ) -> Iterator[Event]:
        """The run's events, oldest first; with ``follow``, new ones as they happen, until the
        run has finished or ``timeout`` seconds have passed (the run goes on)."""
        after = 0
        clock = WaitClock(str(workflow_id), timeout)
        while True:
            page = self._send(self._calls.events_after(workflow_id, after))
            yield from page.events
            after = page.events[-1].id if page.events else after
            if not follow or clock.over():
                return
            if not page.events:
                ended = has_ended(page.status)
                if ended is None:  # a status this version does not know: ask the run
                    detail = self._send(self._calls.get(workflow_id, events=0))
                    ended = detail.finished
                if ended:
                    return
                time.sleep(min(poll_s, clock.left()))

    def download_result(
        self,
        workflow_id: RunId,
        path: str | os.PathLike[str] | None = None,
        *,
        output: str | None = None,
    ) -> bytes:
        """A completed run's result as stored, in memory (``save_result`` streams it to a
        file instead): its image result, or the result ``output`` names (``step.output`` as
        its ``output["results"]`` lists them); with neither, its only result. Also written to
        ``path`` when given. ``Conflict`` while the run has not completed, ``NotFound`` (with
        ``known``, the names it stored) for a result it did not store."""
        try:
            data = self._send(self._calls.result(workflow_id, output))
        except NotFound as exc:
            only = the_only_result(output, exc)
            data = self._send(self._calls.result(workflow_id, only))
        if path is not None:
            Path(path).write_bytes(data)
        return data

    def save_result(
        self, workflow_id: RunId, path: str | os.PathLike[str], *, output: str | None = None
    ) -> SavedResult:
        """Stream a completed run's result into the file ``path``, never whole in memory (a
        video, a large array): which result as ``download_result`` chooses. The file appears
        only once every byte has arrived."""
        try:
            return self._save(self._calls.result(workflow_id, output), Path(path))
        except NotFound as exc:
            only = the_only_result(output, exc)
            return self._save(self._calls.result(workflow_id, only), Path(path))

    def _save(self, call: Call[bytes], path: Path) -> SavedResult:
        partial = path.with_name(f".{path.name}.partial")
        try:
            with self._http.stream(call.method, call.path, timeout=call.timeout) as response:
                if response.is_error:
                    response.read()
                    parse_response(call, response)  # raises the API's error
                size = 0
                with partial.open("wb") as out:
                    for chunk in response.iter_bytes():
                        size += out.write(chunk)
                partial.replace(path)
                kind = response.headers.get("content-type", "application/octet-stream")
                return SavedResult(path, size, kind)
        except httpx.TransportError as exc:
            raise transport_error(self.api_url, exc) from exc
        finally:
            partial.unlink(missing_ok=True)

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
    ) -> WorkflowPage:
        """One page of runs, newest first, filtered by status, definition, policy, ``tags``
        (every one), ``input`` (JSON the run's input contains) and ``schedule``: the first,
        or the one ``cursor`` (a page's ``next_cursor`` or ``prev_cursor``) starts.
        ``offset`` (at most 10,000) is for pages an older API numbered."""
        call = self._calls.list_workflows(
            status=status,
            workflow=workflow,
            policy=policy,
            tags=tags,
            input=input,
            schedule=schedule,
            limit=limit,
            cursor=cursor,
            offset=offset,
        )
        return self._send(call)

    def iter_workflows(
        self,
        *,
        status: str | None = None,
        workflow: str | None = None,
        policy: str | None = None,
        tags: Sequence[str] | None = None,
        input: Mapping[str, Any] | None = None,
        schedule: str | None = None,
        page_size: int = 200,
    ) -> Iterator[Workflow]:
        """Every run that matches (the filters of ``list_workflows``), newest first, page
        after page by cursor: a run that existed when it began is met once, whatever is
        started meanwhile."""
        cursor: str | None = None
        while True:
            call = self._calls.list_workflows(
                status=status,
                workflow=workflow,
                policy=policy,
                tags=tags,
                input=input,
                schedule=schedule,
                limit=page_size,
                cursor=cursor,
            )
            page = self._send(call)
            yield from page.items
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def cancel(self, workflow_id: RunId) -> Workflow:
        """Cancel a PENDING or RUNNING run (``Conflict`` once it has finished)."""
        return self._send(self._calls.cancel(workflow_id))

    def retry(self, workflow_id: RunId) -> Workflow:
        """A new run with the same input as a FAILED, CANCELLED or TIMED_OUT one."""
        return self._send(self._calls.retry(workflow_id))

    def images(self, workflow_id: RunId) -> WorkflowImages:
        """The run's input and result images: size, format and whether a thumbnail exists."""
        return self._send(self._calls.images(workflow_id))

    def thumbnail(self, workflow_id: RunId, role: str = "result") -> bytes:
        """A small JPEG of the run's ``input`` or ``result`` image."""
        return self._send(self._calls.thumbnail(workflow_id, role))

    # -- task runs, workers, the CDI directory, statistics -----------------------------------
    def active_task_runs(
        self, *, worker: str | None = None, workflow: RunId | None = None, limit: int = 200
    ) -> list[ActiveTaskRun]:
        """Unfinished task runs, oldest first (of one worker or workflow when given)."""
        call = self._calls.active_task_runs(worker=worker, workflow=workflow, limit=limit)
        return self._send(call)

    def task_runs(
        self,
        finished_after: datetime,
        started_before: datetime,
        *,
        after_id: int = 0,
        limit: int = 200,
    ) -> list[TaskRunInWorkflow]:
        """Task runs that ran, at least in part, between the two moments, by id; a full page
        goes on from ``after_id`` = its last id."""
        call = self._calls.task_runs(finished_after, started_before, after_id=after_id, limit=limit)
        return self._send(call)

    def pause(self, workflow_id: RunId) -> Workflow:
        """Pause a run: what runs finishes, its next steps wait until ``resume``."""
        return self._send(self._calls.pause(workflow_id))

    def resume(self, workflow_id: RunId) -> Workflow:
        return self._send(self._calls.pause(workflow_id, paused=False))

    def workers(self) -> list[Worker]:
        return self._send(self._calls.workers())

    def retention(self) -> Retention:
        """How long finished runs are kept, by default and per definition, and what pruning
        has done (the last pass, the totals)."""
        return self._send(self._calls.retention())

    def set_retention(
        self, workflow: str, *, days: int | None = None, results: str | None = None
    ) -> Definition:
        """A definition's own retention: ``days`` its finished runs are kept (0: for ever),
        ``results`` ("keep" or "delete") what pruning does to their results; ``None``: the
        default. An admin's."""
        return self._send(self._calls.set_retention(workflow, days=days, results=results))

    def cdi_objects(self) -> CdiDirectory:
        """Every CDI object and minion the CDI controller knows."""
        return self._send(self._calls.cdi_objects())

    def stats(self, *, window_minutes: int = 15) -> Stats:
        """Runs by status, and per minute of the window completions, failures and latency."""
        return self._send(self._calls.stats(window_minutes=window_minutes))

    # -- API keys and health -----------------------------------------------------------------
    def whoami(self) -> Identity:
        """The key this client sends: its name and role."""
        return self._send(self._calls.whoami())

    def keys(self) -> list[Key]:
        return self._send(self._calls.keys())

    def create_key(self, name: str, role: str | None = None) -> KeyCreated:
        """Issue a key (role ``viewer`` unless given); ``.key`` is shown this once."""
        return self._send(self._calls.create_key(name, role))

    def revoke_key(self, key_id: str | uuid.UUID) -> None:
        self._send(self._calls.revoke_key(key_id))

    def health(self) -> Liveness:
        """Whether the API process answers."""
        return self._send(self._calls.health())

    def readiness(self, scope: str | None = None) -> Readiness:
        """Whether every part behind the API answers: ``status`` and each check, also when
        one is down (the API's 503). ``scope="api"``: whether the API process itself can
        answer (Postgres and Redis)."""
        return self._send(self._calls.readiness(scope))

    # -- schedules ---------------------------------------------------------------------------
    def create_schedule(
        self,
        name: str,
        workflow: str,
        cron: str,
        *,
        timezone: str | None = None,
        catchup: str | None = None,
        grace_s: float | None = None,
        input: Mapping[str, Any] | None = None,
        policy: str | None = None,
        data_plane: str | None = None,
        version: int | None = None,
        priority: int | None = None,
        tags: Sequence[str] | None = None,
        paused: bool | None = None,
    ) -> Schedule:
        """A run of ``workflow`` at each tick of ``cron`` (five fields, six with seconds
        first, or @daily...) in ``timezone`` (default UTC); ``catchup`` (skip, latest, all)
        says what becomes of ticks missed by more than ``grace_s``."""
        call = self._calls.create_schedule(
            name,
            workflow,
            cron,
            timezone=timezone,
            catchup=catchup,
            grace_s=grace_s,
            input=dict(input) if input is not None else None,
            policy=policy,
            data_plane=data_plane,
            version=version,
            priority=priority,
            tags=list(tags) if tags else None,
            paused=paused,
        )
        return self._send(call)

    def schedules(self, workflow: str | None = None) -> list[Schedule]:
        """Every schedule (of ``workflow``), with its next fire times."""
        return self._send(self._calls.schedules(workflow))

    def schedule(self, name: str) -> Schedule:
        return self._send(self._calls.schedule(name))

    def pause_schedule(self, name: str) -> Schedule:
        return self._send(self._calls.pause_schedule(name))

    def resume_schedule(self, name: str) -> Schedule:
        """Fire again from the next tick (the paused ones are not caught up)."""
        return self._send(self._calls.pause_schedule(name, paused=False))

    def delete_schedule(self, name: str) -> None:
        self._send(self._calls.delete_schedule(name))

    # -- webhooks (admin keys) ---------------------------------------------------------------
    def create_webhook(
        self,
        name: str,
        url: str,
        *,
        events: Sequence[str] | None = None,
        workflow: str | None = None,
        secret: str | None = None,
    ) -> WebhookCreated:
        """POST ``events`` (default: every end of a run; also ``task.completed``, ...) of
        every run (of ``workflow``) to ``url``, signed with ``secret`` (default: a new one,
        in the answer only)."""
        call = self._calls.create_webhook(
            name, url, events=events, workflow=workflow, secret=secret
        )
        return self._send(call)

    def webhooks(self) -> list[Webhook]:
        return self._send(self._calls.webhooks())

    def webhook(self, name: str) -> Webhook:
        return self._send(self._calls.webhook(name))

    def delete_webhook(self, name: str) -> None:
        self._send(self._calls.delete_webhook(name))

    def deliveries(
        self,
        name: str,
        *,
        status: str | None = None,
        limit: int = 50,
        before_id: int | None = None,
        offset: int | None = None,
    ) -> DeliveryPage:
        """The webhook's delivery log, newest first, a page at a time: the next page has
        ``before_id`` set to this one's ``next_before_id``."""
        call = self._calls.deliveries(
            name, status=status, limit=limit, before_id=before_id, offset=offset
        )
        return self._send(call)
