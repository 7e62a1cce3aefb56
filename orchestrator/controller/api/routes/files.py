"""``/api/inputs``: a file into the stack's bucket, for a run to read.

A client with no S3 credentials uploads its input here (``multipart/form-data``, one file;
an operator's key) and gets the ``s3://`` URI to start a workflow with, under the first of
the S3 policy's input prefixes (``uploads/<random id>/<file name>``): an image goes in
``input.image``, any other file in the field of ``input.data`` its task reads (the
``ar_video`` workflow's ``input.data.video``).

An upload is checked against the operator's policy before it is stored: at most
``CDIFLOW_UPLOAD_MAX_BYTES`` (default ``MAX_INPUT_BYTES``, the most a worker reads), of a
content type ``CDIFLOW_UPLOAD_TYPES`` names, as detected from its bytes
(``workflows.filetypes``: the name and the type a client declares are not trusted). An image
has its header read and its pixel count checked against ``MAX_PIXELS`` (the workers' own
limit), a ``.npy`` array its header; their contents are not decoded here: a file truncated
after a sound header fails its workflow with that reason, as any input does. The detected
type is recorded with the object (its ``Content-Type``) and answered.
"""

from __future__ import annotations

import re
import uuid
from pathlib import PurePosixPath
from typing import Annotated, Final

from fastapi import APIRouter, File, UploadFile

from orchestrator.controller.api.deps import SettingsDep, StoreDep
from orchestrator.controller.auth import Operator
from orchestrator.errors import InvalidRequest, RequestTooLarge, UnsupportedType
from orchestrator.schemas import InputPublic, error_responses
from orchestrator.settings import Settings
from workflows.errors import InvalidData, InvalidImage
from workflows.filetypes import FileType, detect, matches
from workflows.imagebuf import open_image

router = APIRouter(tags=["files"])

# multipart framing around the file: boundaries and part headers
UPLOAD_OVERHEAD: Final = 64 * 1024
_UNSAFE: Final = re.compile(r"[^A-Za-z0-9._-]+")
UPLOAD_ADVICE: Final = (
    "uploads are at most CDIFLOW_UPLOAD_MAX_BYTES (default MAX_INPUT_BYTES); send a smaller "
    "file, or have the operator raise the limit"
)


def upload_limit(settings: Settings) -> int:
    """The largest upload request body: the largest file plus its multipart framing."""
    return settings.upload_limit + UPLOAD_OVERHEAD


def _safe_name(filename: str | None, kind: FileType) -> str:
    base = (filename or "").rsplit("/", 1)[-1].rsplit("\\", 1)[-1]
    safe = _UNSAFE.sub("_", base).strip("._")[:100]
    if not safe:
        return "input" + kind.extension
    return safe if PurePosixPath(safe).suffix else safe + kind.extension


def _refuse(name: str, problem: str) -> InvalidRequest:
    message = f"{name}: {problem}"
    return InvalidRequest(message, [message])


@router.post("/inputs", status_code=201, responses=error_responses(413, 415, 422, 503))
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
    """Store an input file in S3; its ``uri`` starts a workflow (``input.image``, or a field
    of ``input.data``).

    413 over ``CDIFLOW_UPLOAD_MAX_BYTES``; 415 for a content type (detected from the bytes)
    outside ``CDIFLOW_UPLOAD_TYPES``; 422 for an empty file, an image whose header is broken
    or whose pixels exceed ``MAX_PIXELS``, or a ``.npy`` array NumPy cannot load without
    pickle; 503 when S3 fails. The object is named ``uploads/<random id>/<file name>`` under
    the first input prefix (``CDIFLOW_S3_INPUTS``; default the stack's bucket): uploads never
    collide.
    """
    name = file.filename or "the upload"
    data = file.file.read(settings.upload_limit + 1)
    if len(data) > settings.upload_limit:
        raise RequestTooLarge(settings.upload_limit, what=name, advice=UPLOAD_ADVICE)
    if not data:
        raise _refuse(name, "the file is empty")
    try:
        kind = detect(data, file.filename)
    except InvalidData as exc:
        raise _refuse(name, str(exc)) from exc
    if not matches(kind.content_type, settings.upload_types):
        problem = (
            f"{name} is {kind.content_type}, which this cdiflow does not take; it takes "
            f"{', '.join(settings.upload_types)} (CDIFLOW_UPLOAD_TYPES)"
        )
        raise UnsupportedType(problem, [problem])
    fmt, width, height = None, None, None
    if kind.is_image:
        try:
            image = open_image(data, settings.max_pixels)
        except InvalidImage as exc:
            raise _refuse(name, str(exc)) from exc
        fmt, (width, height) = image.format, image.size
    uri = store.policy.upload_uri(f"{uuid.uuid4()}/{_safe_name(file.filename, kind)}")
    store.put(uri, data, kind.content_type, input_upload=True)
    return InputPublic(
        uri=uri,
        bytes=len(data),
        content_type=kind.content_type,
        format=fmt,
        width=width,
        height=height,
    )
