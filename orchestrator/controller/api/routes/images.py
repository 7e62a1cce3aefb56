"""``/api/workflows/{id}/images``: a workflow's input and result, described and thumbnailed.

The dashboard first asks for the description (``available`` and ``problem``) and loads a
thumbnail only for an image that has one, so a missing or broken input shows its reason
instead of a broken picture. Images are read from S3 by ``ObjectStore``, decoded with the
workers' own guards (``imagebuf.decode_bytes``: pixel limit before decoding), downscaled to a
JPEG and kept in a small in-process cache, so the description and the thumbnail that follows
cost one download.
"""

from __future__ import annotations

import hashlib
import io
import uuid
from dataclasses import dataclass
from typing import Annotated, Final, Literal

from fastapi import APIRouter, Depends, Request, Response
from PIL import Image

from orchestrator.contract.vocabulary import WorkflowStatus
from orchestrator.controller.api.deps import SessionDep, get_settings, get_store
from orchestrator.controller.strict_json import StrictJsonRoute
from orchestrator.controller.ttl_cache import TtlCache
from orchestrator.db import repository as repo
from orchestrator.db.models import Workflow
from orchestrator.errors import (
    InputMissing,
    InputTooLarge,
    InvalidRequest,
    NotFound,
    S3NotAllowed,
    ServiceError,
    StorageError,
)
from orchestrator.objectstore import ObjectStore
from orchestrator.schemas import ImagePublic, WorkflowImagesPublic, error_responses
from orchestrator.settings import Settings
from workflows.errors import InvalidImage
from workflows.imagebuf import decode_bytes

router = APIRouter(prefix="/workflows", tags=["workflows"], route_class=StrictJsonRoute)

Role = Literal["input", "result"]

THUMBNAIL_EDGE: Final = 480  # px, longest side: sharp at 240 CSS px on a 2x screen
_CACHE_ENTRIES: Final = 128  # ~30 KB each
_CACHE_TTL_S: Final = 600.0
# A result is the same picture re-encoded (PNG), so it may be several times the input.
RESULT_LIMIT_FACTOR: Final = 8


@dataclass(frozen=True)
class Preview:
    """One image's description and its JPEG thumbnail, or why there is none."""

    format: str | None = None
    width: int | None = None
    height: int | None = None
    nbytes: int | None = None
    thumbnail: bytes = b""
    problem: str | None = None
    # Why there is no thumbnail, as the thumbnail route answers it: 404, 422 or 503.
    failure: Literal["missing", "unreadable", "unavailable"] | None = None

    @property
    def etag(self) -> str:
        return '"' + hashlib.sha1(self.thumbnail, usedforsecurity=False).hexdigest() + '"'


class PreviewCache(TtlCache[Preview]):
    """Previews by URI: the most recent ``entries``, each for ``ttl`` seconds; thread-safe."""

    def __init__(self, entries: int = _CACHE_ENTRIES, ttl: float = _CACHE_TTL_S) -> None:
        super().__init__(entries, ttl)


@dataclass
class Previews:
    """What the image routes share across requests (``app.state.previews``)."""

    settings: Settings
    store: ObjectStore
    cache: PreviewCache

    def of(self, uri: str, role: Role) -> Preview:
        """The preview of ``uri``, from the cache or made now; S3 errors become problems."""
        cached = self.cache.get(uri)
        if cached is not None:
            return cached
        limit = self.settings.max_input_bytes
        if role == "result":
            limit *= RESULT_LIMIT_FACTOR
        try:
            data = self.store.get(uri, limit)
        except InputMissing:
            # Not cached: it may be uploaded, or the result written, a moment later.
            return Preview(problem=f"{uri} does not exist", failure="missing")
        except InputTooLarge as exc:
            preview = Preview(problem=f"too large to preview: {exc}", failure="unreadable")
        except StorageError as exc:
            return Preview(problem=str(exc), failure="unavailable")  # transient: not cached
        else:
            preview = _thumbnail(data, self.settings.max_pixels)
        self.cache.put(uri, preview)
        return preview


def _thumbnail(data: bytes, max_pixels: int) -> Preview:
    try:
        image = decode_bytes(data, max_pixels)
    except InvalidImage as exc:
        return Preview(nbytes=len(data), problem=str(exc), failure="unreadable")
    width, height = image.size
    with Image.open(io.BytesIO(data)) as header:  # decode_bytes succeeded: the header is sound
        fmt = header.format
    image = image.convert("RGB")
    image.thumbnail((THUMBNAIL_EDGE, THUMBNAIL_EDGE), Image.Resampling.LANCZOS)
    out = io.BytesIO()
    image.save(out, "JPEG", quality=82, optimize=True)
    return Preview(
        format=fmt, width=width, height=height, nbytes=len(data), thumbnail=out.getvalue()
    )


def get_previews(request: Request) -> Previews:
    """The app's ``Previews``, made on first use."""
    state = request.app.state
    previews: Previews | None = getattr(state, "previews", None)
    if previews is None:
        previews = Previews(get_settings(request), get_store(request), PreviewCache())
        state.previews = previews
    return previews


PreviewsDep = Annotated[Previews, Depends(get_previews)]


def _uri_of(row: Workflow, role: Role) -> str | None:
    if role == "input":
        image = row.input.get("image")
        return image if isinstance(image, str) else None
    return row.result_uri


def _check_policy(uri: str, role: Role, previews: Previews) -> None:
    """``S3NotAllowed`` for an image outside the S3 policy (a row stored before the policy
    changed, or written by other means): the API shows nothing it could not have fetched."""
    policy = previews.store.policy
    if role == "input":
        policy.check_input(uri)
    else:
        policy.check_result(uri)


def _absent_result(row: Workflow) -> str:
    if row.status == WorkflowStatus.COMPLETED:
        return "the workflow completed without a result image"
    if row.status.finished:
        return f"no result: the workflow is {row.status.value}"
    return "no result yet: the workflow is still running"


def _describe(row: Workflow, role: Role, previews: Previews) -> ImagePublic:
    uri = _uri_of(row, role)
    if uri is None:
        problem = _absent_result(row) if role == "result" else "the workflow names no input"
        return ImagePublic(role=role, uri=None, available=False, problem=problem, format=None,
                           width=None, height=None, bytes=None, thumbnail_url=None)  # fmt: skip
    try:
        _check_policy(uri, role, previews)
    except S3NotAllowed as exc:
        return ImagePublic(role=role, uri=uri, available=False, problem=str(exc), format=None,
                           width=None, height=None, bytes=None, thumbnail_url=None)  # fmt: skip
    preview = previews.of(uri, role)
    url = f"/api/workflows/{row.id}/images/{role}" if preview.problem is None else None
    if url is not None:
        url += f"?v={preview.etag.strip(chr(34))[:12]}"  # a new picture gets a new URL
    return ImagePublic(
        role=role,
        uri=uri,
        available=preview.problem is None,
        problem=preview.problem,
        format=preview.format,
        width=preview.width,
        height=preview.height,
        bytes=preview.nbytes,
        thumbnail_url=url,
    )


@router.get("/{workflow_id}/images", responses=error_responses(404))
def describe_images(
    workflow_id: uuid.UUID, session: SessionDep, previews: PreviewsDep
) -> WorkflowImagesPublic:
    """The input and result images: size, format and a thumbnail URL, or why there is none."""
    row = repo.get_workflow(session, workflow_id)
    return WorkflowImagesPublic(
        input=_describe(row, "input", previews), result=_describe(row, "result", previews)
    )


@router.get(
    "/{workflow_id}/images/{role}",
    response_class=Response,
    responses={200: {"content": {"image/jpeg": {}}}, **error_responses(404, 422, 503)},
)
def thumbnail(
    workflow_id: uuid.UUID, role: Role, session: SessionDep, previews: PreviewsDep, request: Request
) -> Response:
    """A JPEG at most ``THUMBNAIL_EDGE`` px on its longest side; 404 when there is no image,
    422 when it cannot be decoded, 503 when S3 fails."""
    row = repo.get_workflow(session, workflow_id)
    uri = _uri_of(row, role)
    if uri is None:
        raise NotFound(f"{role} image of workflow", workflow_id)
    _check_policy(uri, role, previews)
    preview = previews.of(uri, role)
    if preview.failure == "missing":
        raise NotFound("image", uri)
    if preview.failure == "unavailable":
        raise ServiceError(preview.problem or "S3 failed", service="s3")
    if preview.problem is not None:
        raise InvalidRequest(preview.problem, [preview.problem])
    headers = {"Cache-Control": "private, max-age=600", "ETag": preview.etag}
    if request.headers.get("if-none-match") == preview.etag:
        return Response(status_code=304, headers=headers)
    return Response(preview.thumbnail, media_type="image/jpeg", headers=headers)
