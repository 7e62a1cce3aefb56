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
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self, TypeVar

import httpx

from cdiflow.client._calls import (
    BUSY_TIMEOUT_S,
    Call,
    Calls,
    ImageSource,
    RunId,
    WaitClock,
    as_image_source,
    busy_delay,
    parse_response,
    transport_error,
)
from cdiflow.client.config import Endpoint, resolve
from cdiflow.client.models import (
    FINISHED,
    Definition,
    DefinitionVersion,
    Event,
    Task,
    Upload,
    Worker,
    Workflow,
    WorkflowDetail,
    WorkflowPage,
)

__all__ = ["Client"]

T = TypeVar("T")


class Client:
    """Every verb of the cdiflow API; errors are the ``cdiflow.client.errors`` tree.

    ``api_url`` and ``api_key`` default to ``$CDIFLOW_API_URL`` / ``$CDIFLOW_API_KEY``, then to
    the stack ``cdiflow up`` runs from ``data_dir`` (``$CDIFLOW_DATA_DIR``, ``./.data``); see
    ``cdiflow.client.config``. Use it as a context manager, or ``close()`` it.

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
        busy_timeout: float = BUSY_TIMEOUT_S,
    ) -> None:
        self.endpoint: Endpoint = resolve(api_url, api_key, data_dir)
        self.busy_timeout = busy_timeout
        headers = {"Accept": "application/json"}
        if self.endpoint.key:
            headers["Authorization"] = f"Bearer {self.endpoint.key}"
        self._http = httpx.Client(base_url=self.endpoint.url, headers=headers, transport=transport)
        self._calls = Calls()

    @property
    def api_url(self) -> str:
        return self.endpoint.url

    def close(self) -> None:
        self._http.close()

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
        waited = 0.0
        while True:
            try:
                response = self._http.request(
                    call.method,
                    call.path,
                    params=call.params,
                    json=call.json,
                    files=call.files,
                    timeout=call.timeout,
                )
            except httpx.TransportError as exc:
                raise transport_error(self.api_url, exc) from exc
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
    ) -> Task:
        """Register task ``name`` run by ``module`` (``package.module:function``), or replace
        it. Settings left out come from the function's ``@task`` (else the API's defaults)."""
        call = self._calls.register_task(
            name,
            module,
            timeout_s=timeout_s,
            retries=retries,
            retry_backoff_s=retry_backoff_s,
            description=description,
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
    def apply_definition(self, definition: Mapping[str, Any]) -> Definition:
        """Save a workflow definition (``{"name", "description", "tasks": [...]}``): a new
        version when it differs from the current one, nothing when it does not."""
        return self._send(self._calls.apply_definition(definition))

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

    # -- inputs and runs ---------------------------------------------------------------------
    def upload(
        self, image: bytes | str | os.PathLike[str] | IO[bytes], filename: str | None = None
    ) -> Upload:
        """Store an input image (a path, bytes or an open binary file) in the stack's bucket."""
        return self._send(self._calls.upload(image, filename))

    def start(
        self,
        workflow: str,
        image: ImageSource | None = None,
        *,
        data: Mapping[str, Any] | None = None,
        policy: str | None = None,
        data_plane: str | None = None,
        result_format: str | None = None,
        version: int | None = None,
    ) -> Workflow:
        """Start a run of ``workflow`` on ``image``: an ``s3://`` URI, or a local file (path,
        bytes or open file) uploaded first; ``None`` starts a dataless run. ``data`` reaches
        every task as ``ctx.input``; ``version`` runs that version of the definition."""
        uri, local = as_image_source(image)
        if local is not None:
            uri = self.upload(local).uri
        call = self._calls.start(
            workflow,
            uri,
            data=data,
            policy=policy,
            data_plane=data_plane,
            result_format=result_format,
            version=version,
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
        policy: str | None = None,
        data_plane: str | None = None,
        result_format: str | None = None,
        version: int | None = None,
    ) -> WorkflowDetail:
        """``start`` then ``wait(check=True)``: the completed run, or ``WorkflowFailed``."""
        started = self.start(
            workflow,
            image,
            data=data,
            policy=policy,
            data_plane=data_plane,
            result_format=result_format,
            version=version,
        )
        return self.wait(started.id, timeout, check=True)

    def events(
        self, workflow_id: RunId, *, follow: bool = True, poll_s: float = 0.5
    ) -> Iterator[Event]:
        """The run's events, oldest first; with ``follow``, new ones as they happen, until the
        run has finished."""
        after = 0
        while True:
            page = self._send(self._calls.events_after(workflow_id, after))
            yield from page.events
            after = page.events[-1].id if page.events else after
            if not follow or (page.status in FINISHED and not page.events):
                return
            if not page.events:
                time.sleep(poll_s)

    def download_result(
        self, workflow_id: RunId, path: str | os.PathLike[str] | None = None
    ) -> bytes:
        """The result image of a completed run, as stored (PNG or JPEG); also written to
        ``path`` when given. ``Conflict`` while the run has not completed."""
        data = self._send(self._calls.result(workflow_id))
        if path is not None:
            Path(path).write_bytes(data)
        return data

    def list_workflows(
        self,
        *,
        status: str | None = None,
        workflow: str | None = None,
        policy: str | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> WorkflowPage:
        """One page of runs, newest first, filtered by status, definition and policy."""
        call = self._calls.list_workflows(
            status=status, workflow=workflow, policy=policy, limit=limit, offset=offset
        )
        return self._send(call)

    def cancel(self, workflow_id: RunId) -> Workflow:
        """Cancel a PENDING or RUNNING run (``Conflict`` once it has finished)."""
        return self._send(self._calls.cancel(workflow_id))

    def retry(self, workflow_id: RunId) -> Workflow:
        """A new run with the same input as a FAILED or CANCELLED one."""
        return self._send(self._calls.retry(workflow_id))

    def workers(self) -> list[Worker]:
        return self._send(self._calls.workers())
