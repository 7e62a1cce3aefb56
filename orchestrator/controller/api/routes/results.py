"""A completed run's stored results, streamed out of S3 through the API.

``GET /api/workflows/{id}/result`` is the run's image result (one sink that made an image);
``GET /api/workflows/{id}/results/{step}.{output}`` any result it stored by name, as its
``output.results`` lists them (an image, a ``.npy`` array, a video, JSON, bytes; an element
of a list output as ``{step}.{output}[i]``). Each answers with the content type the object was
stored with, as an attachment, streamed: the API never holds a whole result.

*Why attachments with ``nosniff`` and a sandbox policy:* a result is whatever a task wrote,
served from the API's own origin; a browser must save it, never render it as a page that could
run script with the dashboard's key in reach.
"""

from __future__ import annotations

import mimetypes
import re
import uuid
from pathlib import PurePosixPath
from typing import Any, Final

from fastapi import APIRouter
from fastapi.responses import StreamingResponse

from orchestrator.contract.vocabulary import WorkflowStatus
from orchestrator.controller.api.deps import SessionDep, StoreDep
from orchestrator.controller.strict_json import StrictJsonRoute
from orchestrator.db import repository as repo
from orchestrator.db.models import Workflow
from orchestrator.errors import Conflict, InputMissing, NotFound
from orchestrator.objectstore import ObjectStore
from orchestrator.schemas import error_responses

__all__ = ["known_results", "router", "stored_results"]

router = APIRouter(prefix="/workflows", tags=["workflows"], route_class=StrictJsonRoute)

_LISTED_ELEMENTS: Final = 4  # a longer list output is named as a range in a 404
_UNSAFE: Final = re.compile(r"[^A-Za-z0-9._\[\]-]+")  # what a quoted filename may not hold
_ANY_FILE: Final[dict[int | str, dict[str, Any]]] = {
    200: {"content": {"application/octet-stream": {}, "image/png": {}, "image/jpeg": {}}},
    **error_responses(404, 409, 503),
}


def _listed(row: Workflow) -> dict[str, Any]:
    listed = (row.output or {}).get("results")
    return listed if isinstance(listed, dict) else {}


def stored_results(row: Workflow) -> dict[str, str]:
    """The run's stored results by name, ``{step}.{output}`` (a list output's elements as
    ``{step}.{output}[i]``), each an S3 URI."""
    flat: dict[str, str] = {}
    for name, uri in _listed(row).items():
        if isinstance(uri, str):
            flat[str(name)] = uri
        elif isinstance(uri, list):
            flat.update({f"{name}[{i}]": u for i, u in enumerate(uri) if isinstance(u, str)})
    return flat


def known_results(row: Workflow) -> list[str]:
    """The names a 404 offers, by name: a long list output as ``{step}.{output}[0..n-1]``."""
    known: list[str] = []
    for name, uri in sorted(_listed(row).items()):
        if isinstance(uri, list) and len(uri) > _LISTED_ELEMENTS:
            known.append(f"{name}[0..{len(uri) - 1}]")
        elif isinstance(uri, list):
            known += [f"{name}[{i}]" for i in range(len(uri))]
        else:
            known.append(str(name))
    return known


def _completed(row: Workflow) -> None:
    if row.status is not WorkflowStatus.COMPLETED:
        state = "has not finished" if not row.status.finished else f"is {row.status.value}"
        raise Conflict(f"workflow run {row.id} {state}, so it has no result to download")


def _download(store: ObjectStore, uri: str, what: str, filename: str) -> StreamingResponse:
    store.policy.check_result(uri)
    try:
        found = store.stream(uri)
    except InputMissing as exc:
        raise NotFound(what, uri) from exc
    media_type = (
        found.content_type or mimetypes.guess_type(filename)[0] or "application/octet-stream"
    )
    headers = {
        "Content-Length": str(found.size),
        "Content-Disposition": f'attachment; filename="{_UNSAFE.sub("_", filename)}"',
        "X-Content-Type-Options": "nosniff",
        "Content-Security-Policy": "sandbox; default-src 'none'",
    }
    return StreamingResponse(found.chunks, media_type=media_type, headers=headers)


@router.get("/{workflow_id}/result", response_class=StreamingResponse, responses=_ANY_FILE)
def download_result(
    workflow_id: uuid.UUID, session: SessionDep, store: StoreDep
) -> StreamingResponse:
    """The image result of a completed run, as stored (PNG, JPEG or TIFF).

    409 while the run has not completed (or when it failed or was cancelled: it has no
    result); 404 when the run is unknown, made no single image result (its named results are
    at ``/results/{step}.{output}``) or its result is gone from S3; 503 when S3 fails.
    """
    row = repo.get_workflow(session, workflow_id)
    _completed(row)
    if row.result_uri is None:
        raise NotFound("image result of workflow run", workflow_id, known=known_results(row))
    extension = PurePosixPath(row.result_uri).suffix.lower()
    return _download(store, row.result_uri, "result image", f"{workflow_id}{extension}")


@router.get(
    "/{workflow_id}/results/{name:path}", response_class=StreamingResponse, responses=_ANY_FILE
)
def download_named_result(
    workflow_id: uuid.UUID, name: str, session: SessionDep, store: StoreDep
) -> StreamingResponse:
    """A stored result of a completed run by name, ``{step}.{output}`` as the run's
    ``output.results`` lists it (``{step}.{output}[i]`` for an element of a list output), with
    the content type it was stored with.

    409 while the run has not completed; 404 for a name the run did not store (the answer's
    ``known`` lists those it did) or a result gone from S3; 503 when S3 fails.
    """
    row = repo.get_workflow(session, workflow_id)
    _completed(row)
    results = stored_results(row)
    uri = results.get(name)
    if uri is None:
        raise NotFound(f"result of workflow run {workflow_id}", name, known=known_results(row))
    return _download(store, uri, "result", uri.rsplit("/", 1)[-1])
