"""``/api/inputs`` and ``/api/workflows/{id}/result``: images in and out through the API.

A client with no S3 credentials uploads its input here (``multipart/form-data``, one file;
an operator's key) and gets the ``s3://`` URI to start a workflow with, under the first of
the S3 policy's input prefixes (``uploads/<random id>/<file name>``); it downloads a run's
result the same way (any key).
An upload is checked before it is stored: at most ``MAX_INPUT_BYTES``, an image file Pillow
recognises in one of ``UPLOAD_FORMATS``, its header read and its pixel count within
``MAX_PIXELS`` (the workers' own limits, so an upload that passes does not fail its workflow
for its size). Its pixels are not decoded here: a file truncated after a sound header fails
its workflow with that reason, as any input does.
"""

from __future__ import annotations

import re
import uuid
from typing import Annotated, Final

from fastapi import APIRouter, File, UploadFile
from fastapi.responses import StreamingResponse
from PIL import Image

from orchestrator.contract.vocabulary import WorkflowStatus
from orchestrator.controller.api.deps import SessionDep, SettingsDep, StoreDep
from orchestrator.controller.api.routes.images import RESULT_LIMIT_FACTOR
from orchestrator.controller.auth import Operator
from orchestrator.db import repository as repo
from orchestrator.errors import (
    Conflict,
    InputMissing,
    InvalidRequest,
    NotFound,
    RequestTooLarge,
)
from orchestrator.schemas import InputPublic, error_responses
from workflows.errors import InvalidImage
from workflows.imagebuf import open_image

router = APIRouter(tags=["files"])

UPLOAD_FORMATS: Final = frozenset({"JPEG", "PNG", "WEBP", "GIF", "BMP", "TIFF"})
# multipart framing around the file: boundaries and part headers
UPLOAD_OVERHEAD: Final = 64 * 1024
_UNSAFE: Final = re.compile(r"[^A-Za-z0-9._-]+")
_CONTENT_TYPES: Final = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg"}


def upload_limit(max_input_bytes: int) -> int:
    """The largest upload request body: the largest input plus its multipart framing."""
    return max_input_bytes + UPLOAD_OVERHEAD


def _safe_name(filename: str | None, fmt: str) -> str:
    base = (filename or "").rsplit("/", 1)[-1].rsplit("\\", 1)[-1]
    safe = _UNSAFE.sub("_", base).strip("._")[:100]
    return safe or f"input.{fmt.lower()}"


@router.post("/inputs", status_code=201, responses=error_responses(413, 422, 503))
def upload_input(
    file: Annotated[
        UploadFile,
        File(
            description="An image file (JPEG, PNG, WebP, GIF, BMP or TIFF).",
            json_schema_extra={"minLength": 1},
        ),
    ],
    settings: SettingsDep,
    store: StoreDep,
    principal: Operator,
) -> InputPublic:
    """Store an input image in S3; its ``uri`` starts a workflow.

    413 over ``MAX_INPUT_BYTES``; 422 for a file that is not an image in a known format
    (JPEG, PNG, WebP, GIF, BMP, TIFF) or has more pixels than ``MAX_PIXELS``; 503 when S3
    fails. The object is named ``uploads/<random id>/<file name>`` under the first input
    prefix (``CDIFLOW_S3_INPUTS``; default the stack's bucket): uploads never collide.
    """
    data = file.file.read(settings.max_input_bytes + 1)
    if len(data) > settings.max_input_bytes:
        raise RequestTooLarge(
            settings.max_input_bytes,
            what="the image",
            advice="an input image is at most MAX_INPUT_BYTES; send a smaller image",
        )
    try:
        image = open_image(data, settings.max_pixels)
    except InvalidImage as exc:
        problem = f"{file.filename or 'the upload'}: {exc}"
        raise InvalidRequest(problem, [problem]) from exc
    fmt = image.format or "?"
    if fmt not in UPLOAD_FORMATS:
        problem = (
            f"{file.filename or 'the upload'} is a {fmt} image; upload one of "
            f"{', '.join(sorted(UPLOAD_FORMATS))}"
        )
        raise InvalidRequest(problem, [problem])
    uri = store.policy.upload_uri(f"{uuid.uuid4()}/{_safe_name(file.filename, fmt)}")
    content_type = Image.MIME.get(fmt, "application/octet-stream")
    store.put(uri, data, content_type, input_upload=True)
    width, height = image.size
    return InputPublic(
        uri=uri, bytes=len(data), format=fmt, width=width, height=height, content_type=content_type
    )


@router.get(
    "/workflows/{workflow_id}/result",
    response_class=StreamingResponse,
    responses={200: {"content": {"image/png": {}, "image/jpeg": {}}},
               **error_responses(404, 409, 503)},
)  # fmt: skip
def download_result(
    workflow_id: uuid.UUID, session: SessionDep, settings: SettingsDep, store: StoreDep
) -> StreamingResponse:
    """The result image of a completed run, as stored (PNG or JPEG).

    409 while the run has not completed (or when it failed or was cancelled: it has no
    result); 404 when the run is unknown or its result is gone from S3; 503 when S3 fails.
    """
    row = repo.get_workflow(session, workflow_id)
    if row.status is not WorkflowStatus.COMPLETED:
        state = "has not finished" if not row.status.finished else f"is {row.status.value}"
        raise Conflict(f"workflow run {workflow_id} {state}, so it has no result to download")
    if row.result_uri is None:
        raise NotFound("result of workflow run (it completed without an image)", workflow_id)
    limit = settings.max_input_bytes * RESULT_LIMIT_FACTOR
    store.policy.check_result(row.result_uri)
    try:
        size, chunks = store.stream(row.result_uri, limit)
    except InputMissing as exc:
        raise NotFound("result image", row.result_uri) from exc
    extension = "." + row.result_uri.rsplit(".", 1)[-1].lower()
    headers = {
        "Content-Length": str(size),
        "Content-Disposition": f'attachment; filename="{workflow_id}{extension}"',
    }
    media_type = _CONTENT_TYPES.get(extension, "application/octet-stream")
    return StreamingResponse(chunks, media_type=media_type, headers=headers)
