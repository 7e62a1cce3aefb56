"""What a file is, from its bytes: the content type recorded for an uploaded input and for a
stored result, and the file name extension that goes with it.

A file's own name and the type a client declares are not trusted (either can say ``.mp4`` of
an HTML page); the bytes decide, in this order:

1. a NumPy ``.npy`` array (``application/x-npy``), its header read by NumPy itself;
2. an image in a format the workers decode (``IMAGE_FORMATS``), its header read by Pillow;
3. a signature ``puremagic`` knows well (video, audio, other images, documents, archives);
4. JSON that parses (``application/json``);
5. UTF-8 text without NUL (``text/plain``, or the ``text/*`` type its name suggests, such as
   ``text/csv``);
6. anything else: ``application/octet-stream``.

*Why a signature library and not a table of our own:* containers such as MP4, QuickTime,
Matroska and RIFF need more than a fixed prefix to tell apart, and ``puremagic`` keeps a
maintained database of them in pure Python. Its two-byte signatures, and its guesses at JSON
and text, match random bytes now and then: only its surer matches count, and JSON and text are
decided by parsing.
"""

from __future__ import annotations

import io
import json
import mimetypes
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import puremagic
from PIL import Image, UnidentifiedImageError

from workflows.errors import InvalidData

__all__ = [
    "IMAGE_FORMATS",
    "JSON",
    "NPY",
    "OCTET_STREAM",
    "FileType",
    "detect",
    "extension_for",
    "matches",
    "npy_header",
]

NPY: Final = "application/x-npy"
JSON: Final = "application/json"
OCTET_STREAM: Final = "application/octet-stream"
TEXT: Final = "text/plain"

_NPY_MAGIC: Final = b"\x93NUMPY"
# Image formats Pillow reads whose headers it checks in full (no guess from two bytes).
IMAGE_FORMATS: Final = ("JPEG", "PNG", "WEBP", "GIF", "BMP", "TIFF")
_HEAD: Final = 64 * 1024  # what signatures are looked for in
_SURE: Final = 0.3  # puremagic's confidence of a signature longer than two bytes
# Types puremagic may name that the bytes decide better themselves (see the module's doc).
_PARSED_HERE: Final = frozenset({JSON, TEXT, OCTET_STREAM})
_EXTENSIONS: Final = {
    NPY: ".npy",
    JSON: ".json",
    TEXT: ".txt",
    OCTET_STREAM: ".bin",
    "image/jpeg": ".jpg",
    "image/tiff": ".tiff",
    "video/mp4": ".mp4",
    "video/quicktime": ".mov",
}


@dataclass(frozen=True)
class FileType:
    """A file's content type and the extension it is stored under."""

    content_type: str
    extension: str

    @property
    def is_image(self) -> bool:
        return self.content_type.startswith("image/")


def extension_for(content_type: str) -> str:
    """The usual file name extension (``.mp4``) of a content type; ``.bin`` when none."""
    return _EXTENSIONS.get(content_type) or mimetypes.guess_extension(content_type) or ".bin"


def detect(data: bytes | memoryview, filename: str | None = None) -> FileType:
    """What ``data`` is (see the module's doc). ``InvalidData`` for a ``.npy`` header NumPy
    cannot read or one that needs pickle (an array of Python objects no task may load)."""
    head = bytes(data[:_HEAD])
    if head.startswith(_NPY_MAGIC):
        _check_npy(head)
        return FileType(NPY, ".npy")
    image = _image(data)
    if image is not None:
        return image
    signed = _signature(head)
    if signed is not None:
        return signed
    if _is_json(data):
        return FileType(JSON, ".json")
    if _is_text(data):
        guessed = mimetypes.guess_type(filename or "")[0]
        content_type = guessed if guessed and guessed.startswith("text/") else TEXT
        return FileType(content_type, extension_for(content_type))
    return FileType(OCTET_STREAM, ".bin")


def matches(content_type: str, patterns: tuple[str, ...] | list[str]) -> bool:
    """Whether ``content_type`` is one of ``patterns`` (``video/mp4``, ``video/*``, ``*/*``)."""
    major = content_type.split("/", 1)[0]
    return any(p in (content_type, "*/*", f"{major}/*") for p in patterns)


def npy_header(head: bytes, refusal: str) -> tuple[tuple[int, ...], bool, np.dtype[Any], int]:
    """A ``.npy`` file's shape, Fortran order, dtype and where its data starts, read by NumPy
    from the file's first bytes; ``InvalidData`` starting with ``refusal`` if it cannot."""
    stream = io.BytesIO(head)
    try:
        major, _minor = np.lib.format.read_magic(stream)
        if major == 1:
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(stream)
        else:
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(stream)
    except ValueError as exc:
        raise InvalidData(f"{refusal}: {exc}") from exc
    return shape, fortran, dtype, stream.tell()


def _check_npy(head: bytes) -> None:
    _shape, _fortran, dtype, _offset = npy_header(
        head, "a .npy file whose header NumPy cannot read"
    )
    if dtype.hasobject:
        raise InvalidData(
            f"a .npy array of dtype {dtype} holds Python objects, which no task may load "
            "(it would need pickle); save a numeric, boolean or fixed-width string array"
        )


def _image(data: bytes | memoryview) -> FileType | None:
    try:
        with Image.open(io.BytesIO(data), formats=IMAGE_FORMATS) as image:
            fmt = image.format or ""
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError):
        return None
    content_type = Image.MIME.get(fmt, f"image/{fmt.lower()}")
    return FileType(content_type, extension_for(content_type))


def _signature(head: bytes) -> FileType | None:
    if not head:
        return None
    try:
        found = puremagic.magic_string(head)
    except (puremagic.PureError, ValueError):
        return None
    for match in found:
        sure = match.confidence >= _SURE
        if sure and match.mime_type and match.mime_type not in _PARSED_HERE:
            extension = _EXTENSIONS.get(match.mime_type) or match.extension or ".bin"
            return FileType(match.mime_type, extension)
    return None


def _is_json(data: bytes | memoryview) -> bool:
    start = bytes(data[:64]).lstrip(b" \t\r\n\xef\xbb\xbf")
    if not start or start[:1] not in b'{["-0123456789tfn':
        return False
    try:
        json.loads(bytes(data))
    except ValueError:
        return False
    return True


def _is_text(data: bytes | memoryview) -> bool:
    raw = bytes(data)
    if not raw or b"\0" in raw:
        return False
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
