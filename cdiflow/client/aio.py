"""``AsyncClient``: the cdiflow API from asyncio, verb for verb as ``Client``.

    from cdiflow.client import AsyncClient

    async with AsyncClient() as api:
        run = await api.run("image_pipeline", "photo.jpg")
        async for event in api.events(run.id, follow=False):
            print(event.kind)

Written by ``tools/unasync_client.py`` from ``sync.py``: edit that file, then run the tool.

Every method sends one request (``wait``, ``run`` and ``events`` several) and raises from
``cdiflow.client.errors``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Mapping
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

__all__ = ["AsyncClient"]

T = TypeVar("T")


class AsyncClient:
    """Every verb of the cdiflow API; errors are the ``cdiflow.client.errors`` tree.

    ``api_url`` and ``api_key`` default to ``$CDIFLOW_API_URL`` / ``$CDIFLOW_API_KEY``, then to
    the stack ``cdiflow up`` runs from ``data_dir`` (``$CDIFLOW_DATA_DIR``, ``./.data``); see
    ``cdiflow.client.config``. Use it as an async context manager, or ``aclose()`` it.

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
        transport: httpx.AsyncBaseTransport | None = None,
        busy_timeout: float = BUSY_TIMEOUT_S,
    ) -> None:
        self.endpoint: Endpoint = resolve(api_url, api_key, data_dir)
        self.busy_timeout = busy_timeout
        headers = {"Accept": "application/json"}
        if self.endpoint.key:
            headers["Authorization"] = f"Bearer {self.endpoint.key}"
        self._http = httpx.AsyncClient(
            base_url=self.endpoint.url, headers=headers, transport=transport
        )
        self._calls = Calls()

    @property
    def api_url(self) -> str:
        return self.endpoint.url

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def _send(self, call: Call[T]) -> T:
        waited = 0.0
        while True:
            try:
                response = await self._http.request(
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
            await asyncio.sleep(delay)
            waited += delay

    # -- tasks ---------------------------------------------------------------------------
    async def register_task(
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
        return await self._send(call)

    async def tasks(self) -> list[Task]:
        """Every registered task, by name."""
        return await self._send(self._calls.tasks())

    async def task(self, name: str) -> Task:
        return await self._send(self._calls.task(name))

    async def delete_task(self, name: str) -> None:
        """Delete a task (``Conflict`` while a workflow definition uses it)."""
        await self._send(self._calls.delete_task(name))

    # -- workflow definitions ----------------------------------------------------------------
    async def apply_definition(self, definition: Mapping[str, Any]) -> Definition:
        """Save a workflow definition (``{"name", "description", "tasks": [...]}``): a new
        version when it differs from the current one, nothing when it does not."""
        return await self._send(self._calls.apply_definition(definition))

    async def definitions(self) -> list[Definition]:
        return await self._send(self._calls.definitions())

    async def definition(self, name: str) -> Definition:
        return await self._send(self._calls.definition(name))

    async def definition_versions(self, name: str) -> list[DefinitionVersion]:
        """Every version of a workflow definition, newest first."""
        return await self._send(self._calls.definition_versions(name))

    async def definition_version(self, name: str, version: int) -> DefinitionVersion:
        return await self._send(self._calls.definition_version(name, version))

    async def delete_definition(self, name: str) -> None:
        """Delete a workflow definition (``Conflict`` while runs of it are pending or running)."""
        await self._send(self._calls.delete_definition(name))

    # -- inputs and runs ---------------------------------------------------------------------
    async def upload(
        self, image: bytes | str | os.PathLike[str] | IO[bytes], filename: str | None = None
    ) -> Upload:
        """Store an input image (a path, bytes or an open binary file) in the stack's bucket."""
        return await self._send(self._calls.upload(image, filename))

    async def start(
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
            uri = (await self.upload(local)).uri
        call = self._calls.start(
            workflow,
            uri,
            data=data,
            policy=policy,
            data_plane=data_plane,
            result_format=result_format,
            version=version,
        )
        return await self._send(call)

    async def get(self, workflow_id: RunId, *, events: int = 100) -> WorkflowDetail:
        """A run with its task runs, hand-offs and latest ``events``."""
        return await self._send(self._calls.get(workflow_id, events=events))

    async def wait(
        self, workflow_id: RunId, timeout: float | None = None, *, check: bool = False
    ) -> WorkflowDetail:
        """The run's detail once it has finished (long polls: no busy loop). ``WaitTimeout``
        after ``timeout`` seconds; with ``check``, ``WorkflowFailed`` unless it completed."""
        clock = WaitClock(str(workflow_id), timeout)
        while True:
            detail = await self._send(self._calls.get(workflow_id, wait_s=clock.next_wait()))
            if (settled := clock.settle(detail, check)) is not None:
                return settled

    async def run(
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
        started = await self.start(
            workflow,
            image,
            data=data,
            policy=policy,
            data_plane=data_plane,
            result_format=result_format,
            version=version,
        )
        return await self.wait(started.id, timeout, check=True)

    async def events(
        self, workflow_id: RunId, *, follow: bool = True, poll_s: float = 0.5
    ) -> AsyncIterator[Event]:
        """The run's events, oldest first; with ``follow``, new ones as they happen, until the
        run has finished."""
        after = 0
        while True:
            page = await self._send(self._calls.events_after(workflow_id, after))
            for event in page.events:
                yield event
            after = page.events[-1].id if page.events else after
            if not follow or (page.status in FINISHED and not page.events):
                return
            if not page.events:
                await asyncio.sleep(poll_s)

    async def download_result(
        self, workflow_id: RunId, path: str | os.PathLike[str] | None = None
    ) -> bytes:
        """The result image of a completed run, as stored (PNG or JPEG); also written to
        ``path`` when given. ``Conflict`` while the run has not completed."""
        data = await self._send(self._calls.result(workflow_id))
        if path is not None:
            Path(path).write_bytes(data)
        return data

    async def list_workflows(
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
        return await self._send(call)

    async def cancel(self, workflow_id: RunId) -> Workflow:
        """Cancel a PENDING or RUNNING run (``Conflict`` once it has finished)."""
        return await self._send(self._calls.cancel(workflow_id))

    async def retry(self, workflow_id: RunId) -> Workflow:
        """A new run with the same input as a FAILED or CANCELLED one."""
        return await self._send(self._calls.retry(workflow_id))

    async def workers(self) -> list[Worker]:
        return await self._send(self._calls.workers())
