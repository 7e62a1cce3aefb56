"""The kinds of data a task passes to another, and how each is laid out in a CDI object and
stored as a file.

===========  ==================================  ==========================  ===============
kind         Python value                        in a CDI object             as a file (S3)
===========  ==================================  ==========================  ===============
``image``    a Pillow image                      ``imagebuf`` (``CDIIMG2``)  the run's result
                                                                             format (PNG/JPEG)
``array``    a NumPy array (no Python objects)   NumPy's ``.npy`` format     ``.npy``
``bytes``    ``bytes`` (read: a read-only        the bytes themselves        the bytes, typed
             ``memoryview``)                                                 by their content
                                                                             (``filetypes``)
``json``     anything ``json.dumps`` takes       UTF-8 JSON                  ``.json``
===========  ==================================  ==========================  ===============

*Why ``.npy`` for arrays:* its header carries dtype, shape and order, and pads itself so the
data starts 64-byte aligned; a reader maps the data where it lies (``np.frombuffer``, no copy),
and the stored result is the object's own bytes, which NumPy and every tool that reads ``.npy``
open as they are. A JSON value of at most ``INLINE_LIMIT`` bytes travels inside the messages
instead of an object (it costs less to send than an object costs to make, hand over and free).

A value read from an object is read-only and maps the object's memory: an image through
``imagebuf.map_image``, an array through ``np.frombuffer`` (``writeable`` False), bytes as a
read-only ``memoryview``. A task that wants to change it makes a copy; a task that wants to keep
it beyond its call copies it too (the object is freed once its last reader is done).

Each kind is one ``Codec`` in ``CODECS``: its size in an object, writing and reading it there,
and its file. Adding a kind: its ``Kind`` member, its codec and row, what values travel as it
(``kind_of``), and its tests.
"""

from __future__ import annotations

import abc
import enum
import io
import json
import math
from collections.abc import Mapping
from typing import Any, Final

import numpy as np
import numpy.typing as npt
from PIL import Image

from workflows import filetypes, imagebuf
from workflows.errors import InvalidData, InvalidImage
from workflows.filetypes import FileType

__all__ = [
    "CODECS",
    "INLINE_LIMIT",
    "Codec",
    "Kind",
    "decode_file",
    "encode_file",
    "json_bytes",
    "kind_of",
    "read_value",
    "size_of",
    "write_value",
]

INLINE_LIMIT: Final = 64 * 1024  # JSON values up to this many bytes travel in the messages

_NPY_ALIGN: Final = 64  # numpy pads the .npy header to this


class Kind(enum.StrEnum):
    """What a datum is (``docs/architecture.md``, *Named data*)."""

    IMAGE = "image"
    ARRAY = "array"
    BYTES = "bytes"
    JSON = "json"


def kind_of(value: Any) -> Kind:
    """The kind a task's output value travels as; ``InvalidData`` for what none can carry."""
    if isinstance(value, Image.Image):
        return Kind.IMAGE
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            raise InvalidData(
                f"a NumPy array of dtype {value.dtype} holds Python objects, which no other "
                "process can read; use a numeric, boolean or fixed-width string dtype"
            )
        return Kind.ARRAY
    if isinstance(value, bytes | bytearray | memoryview):
        return Kind.BYTES
    return Kind.JSON


def json_bytes(value: Any) -> bytes:
    """``value`` as compact UTF-8 JSON; ``InvalidData`` if JSON cannot hold it."""
    try:
        return json.dumps(value, allow_nan=False, separators=(",", ":")).encode()
    except (TypeError, ValueError) as exc:
        raise InvalidData(
            f"a value of type {type(value).__name__} is none of image, NumPy array, bytes "
            f"or JSON: {exc}"
        ) from exc


class Codec(abc.ABC):
    """How one kind of value lies in a CDI object and in a file."""

    @abc.abstractmethod
    def size(self, value: Any) -> int:
        """Bytes an object needs to hold ``value``."""

    @abc.abstractmethod
    def write(self, buf: memoryview, value: Any) -> int:
        """Write ``value`` at the start of ``buf`` (sized by ``size``); the bytes written."""

    @abc.abstractmethod
    def read(self, view: memoryview) -> Any:
        """The value an object holds, read-only and mapped over ``view`` where it can be."""

    @abc.abstractmethod
    def encode(self, value: Any, image_format: str) -> tuple[bytes, FileType]:
        """``value`` as a file's bytes, with its content type and extension."""

    @abc.abstractmethod
    def decode(self, data: bytes, max_pixels: int) -> Any:
        """A value from a file's bytes (``encode``'s reverse)."""


class _Image(Codec):
    """A Pillow image: ``imagebuf``'s layout; as a file, the run's result format."""

    def size(self, value: Any) -> int:
        img = imagebuf.normalize_mode(value)
        return imagebuf.required_size(img.width, img.height, img.mode)

    def write(self, buf: memoryview, value: Any) -> int:
        return imagebuf.write_image(buf, value)

    def read(self, view: memoryview) -> Any:
        return imagebuf.map_image(view)

    def encode(self, value: Any, image_format: str) -> tuple[bytes, FileType]:
        fmt = imagebuf.RESULT_FORMATS[image_format]
        return imagebuf.encode_image(value, fmt.pillow), FileType(fmt.content_type, fmt.extension)

    def decode(self, data: bytes, max_pixels: int) -> Any:
        try:
            return imagebuf.decode_bytes(data, max_pixels)
        except InvalidImage as exc:
            raise InvalidData(str(exc)) from exc


class _Array(Codec):
    """A NumPy array: the ``.npy`` format, in an object and as a file."""

    def size(self, value: Any) -> int:
        return len(_npy_header(value)) + int(value.nbytes)

    def write(self, buf: memoryview, value: Any) -> int:
        header = _npy_header(value)
        buf[: len(header)] = header
        if value.nbytes:
            target = np.frombuffer(buf, np.uint8, value.nbytes, len(header))
            order = "F" if value.flags.f_contiguous and not value.flags.c_contiguous else "C"
            target.view(value.dtype).reshape(value.shape, order=order)[...] = value
        return len(header) + int(value.nbytes)

    def read(self, view: memoryview) -> Any:
        return _map_array(view)

    def encode(self, value: Any, image_format: str) -> tuple[bytes, FileType]:
        out = io.BytesIO()
        np.save(out, value, allow_pickle=False)
        return out.getvalue(), FileType(filetypes.NPY, ".npy")

    def decode(self, data: bytes, max_pixels: int) -> Any:
        try:
            return np.load(io.BytesIO(data), allow_pickle=False)
        except ValueError as exc:
            raise InvalidData(f"not a .npy array: {exc}") from exc


class _Bytes(Codec):
    """Bytes as they are; read as a read-only ``memoryview``; as a file, typed by content."""

    def size(self, value: Any) -> int:
        return int(memoryview(value).nbytes)

    def write(self, buf: memoryview, value: Any) -> int:
        return _copy_in(buf, memoryview(value).cast("B"))

    def read(self, view: memoryview) -> Any:
        return view.toreadonly()

    def encode(self, value: Any, image_format: str) -> tuple[bytes, FileType]:
        data = bytes(value)
        try:
            return data, filetypes.detect(data)
        except InvalidData:  # looks like a .npy it is not: plain bytes
            return data, FileType(filetypes.OCTET_STREAM, ".bin")

    def decode(self, data: bytes, max_pixels: int) -> Any:
        return data


class _Json(Codec):
    """Anything ``json.dumps`` takes, as UTF-8 JSON."""

    def size(self, value: Any) -> int:
        return len(json_bytes(value))

    def write(self, buf: memoryview, value: Any) -> int:
        return _copy_in(buf, memoryview(json_bytes(value)))

    def read(self, view: memoryview) -> Any:
        try:
            return json.loads(bytes(view))
        except ValueError as exc:
            raise InvalidData(f"an object of kind json holds no JSON: {exc}") from exc

    def encode(self, value: Any, image_format: str) -> tuple[bytes, FileType]:
        return json_bytes(value), FileType(filetypes.JSON, ".json")

    def decode(self, data: bytes, max_pixels: int) -> Any:
        try:
            return json.loads(data)
        except ValueError as exc:
            raise InvalidData(f"not JSON: {exc}") from exc


# Each kind with how it lies in an object and in a file: the one place that says so.
CODECS: Final[Mapping[Kind, Codec]] = {
    Kind.IMAGE: _Image(),
    Kind.ARRAY: _Array(),
    Kind.BYTES: _Bytes(),
    Kind.JSON: _Json(),
}


def size_of(value: Any, kind: Kind) -> int:
    """Bytes an object of ``kind`` needs to hold ``value``."""
    return CODECS[kind].size(value)


def write_value(buf: memoryview, value: Any, kind: Kind) -> int:
    """Write ``value`` at the start of ``buf`` (sized by ``size_of``); the bytes written. One
    copy of the data, nothing allocated for it on the way."""
    return CODECS[kind].write(buf, value)


def read_value(view: memoryview, kind: Kind) -> Any:
    """The value an object of ``kind`` holds, read-only and mapped over ``view`` where the
    kind allows (image, array, bytes): it pins the object while it lives."""
    return CODECS[kind].read(view)


def encode_file(value: Any, kind: Kind, image_format: str = "png") -> tuple[bytes, FileType]:
    """``value`` as a file's bytes, with its content type and extension (an image in
    ``image_format``, bytes as ``filetypes.detect`` finds them: an MP4 is ``video/mp4``)."""
    return CODECS[kind].encode(value, image_format)


def decode_file(data: bytes, kind: Kind, max_pixels: int = imagebuf.DEFAULT_MAX_PIXELS) -> Any:
    """A value of ``kind`` from a file's bytes (``encode_file``'s reverse)."""
    return CODECS[kind].decode(data, max_pixels)


def _copy_in(buf: memoryview, data: memoryview) -> int:
    buf[: data.nbytes] = data
    return int(data.nbytes)


def _npy_header(array: npt.NDArray[Any]) -> bytes:
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(out, np.lib.format.header_data_from_array_1_0(array))
    return out.getvalue()


def _map_array(view: memoryview) -> npt.NDArray[Any]:
    head = bytes(view[: min(len(view), 16 * _NPY_ALIGN)])
    shape, fortran, dtype, offset = filetypes.npy_header(
        head, "an object of kind array holds no .npy array"
    )
    count = math.prod(shape)
    if offset + count * dtype.itemsize > len(view):
        raise InvalidData(
            f"an object of kind array is {len(view)} bytes, too short for its {dtype} array "
            f"of shape {shape}"
        )
    array = np.frombuffer(view, dtype=dtype, count=count, offset=offset)
    array = array.reshape(shape, order="F" if fortran else "C")
    array.flags.writeable = False
    return array
