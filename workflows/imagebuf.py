"""A decoded image laid out in a flat buffer, plus decode/encode of image files.

The orchestrator moves a buffer (a writable ``memoryview`` over shared memory) between workers
without copying it, so the buffer must carry its own shape. Layout, little-endian::

    offset  size  field
         0     8  magic      b"CDIIMG2\\0"
         8     4  width      uint32, >= 1
        12     4  height     uint32, >= 1
        16     4  mode       ASCII, NUL-padded: b"L\\0\\0\\0", b"RGB\\0" or b"RGBA"
        20     8  nbytes     uint64, must equal width * height * bytes per pixel
        28     4  reserved   zero
        32     …  pixels     row-major, interleaved channels, 8 bits each

Bytes per pixel: ``L`` 1, ``RGBA`` 4, and ``RGB`` **4** (R, G, B and one padding byte) — the
layout Pillow keeps an image in memory, so a task reads its input in place (``map_image``: no
copy) and a result is written with one copy and no allocation. *Why pad RGB:* with 3 bytes a
pixel, every task repacks: 7.4 ms to read a 6.6-megapixel photo into Pillow and 7.5 ms to pack
one back, against 0 and 4.5 ms (one copy into place) in Pillow's layout (``cdiflow bench
images``, 2 MB). The padding costs a third more shared memory, which nothing copies.

The header is 32 bytes so the pixels start 32-byte aligned when the buffer is. The buffer may
be larger than the image (it is sized once and reused); bytes after the pixels are ignored.

Only the modes ``L``, ``RGB`` and ``RGBA`` are stored; ``normalize_mode`` maps everything else
Pillow can decode (palette, CMYK, 16-bit, …) onto one of them.
"""

from __future__ import annotations

import contextlib
import io
import struct
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt
from PIL import Image, ImageOps, UnidentifiedImageError, _imaging

from workflows.errors import InvalidImage, ResultTooLarge
from workflows.tracebacks import clear_frames

__all__ = [
    "DEFAULT_MAX_PIXELS",
    "HEADER_SIZE",
    "MAGIC",
    "MODES",
    "PIXEL_BYTES",
    "RESULT_FORMATS",
    "ImageHeader",
    "ResultFormat",
    "decode_bytes",
    "decode_into",
    "decodes_in_place",
    "encode_image",
    "finish_decode",
    "image_view",
    "map_image",
    "normalize_mode",
    "open_image",
    "read_header",
    "read_image",
    "required_size",
    "write_image",
]

MAGIC: Final = b"CDIIMG2\0"
_HEADER = struct.Struct("<8sII4sQ4x")
HEADER_SIZE: Final = _HEADER.size  # 32
MODES: Final[dict[str, int]] = {"L": 1, "RGB": 3, "RGBA": 4}  # mode -> channels
PIXEL_BYTES: Final[dict[str, int]] = {"L": 1, "RGB": 4, "RGBA": 4}  # mode -> stored bytes
_MAX_DIM: Final = 2**32 - 1
_ORIENTATION: Final = 0x0112  # the EXIF tag

# zlib level of every PNG we write. *Why 1, not Pillow's 6:* on a photo level 6 takes several
# times as long as level 1 for about the same size, more than the image tasks themselves
# (`cdiflow bench images`).
PNG_COMPRESS_LEVEL: Final = 1
JPEG_RESULT_QUALITY: Final = 90


@dataclass(frozen=True)
class ResultFormat:
    """How a workflow's result image is stored: Pillow format, file extension, MIME type."""

    pillow: str
    extension: str
    content_type: str


# ``png`` is lossless (the default: pixels exactly as the tasks left them); ``jpeg`` (quality
# 90) is 20x faster to encode and 4x smaller, for photos that end their journey as photos;
# ``raw`` is lossless too, the pixels as they are in an uncompressed TIFF: ~70x faster to
# encode than PNG and ~2x larger, for images that only travel between tasks over a fast link.
RESULT_FORMATS: Final[dict[str, ResultFormat]] = {
    "png": ResultFormat("PNG", ".png", "image/png"),
    "jpeg": ResultFormat("JPEG", ".jpg", "image/jpeg"),
    "raw": ResultFormat("TIFF", ".tiff", "image/tiff"),
}

# 50 megapixels: above any camera the pipeline expects, far below what exhausts a worker.
DEFAULT_MAX_PIXELS: Final = 50_000_000


@dataclass(frozen=True, slots=True)
class ImageHeader:
    """The shape of an image stored in a buffer."""

    width: int
    height: int
    mode: str

    @property
    def channels(self) -> int:
        return MODES[self.mode]

    @property
    def pixel_bytes(self) -> int:
        return self.width * self.height * PIXEL_BYTES[self.mode]

    @property
    def total_size(self) -> int:
        """Buffer bytes needed for header plus pixels."""
        return HEADER_SIZE + self.pixel_bytes


def required_size(width: int, height: int, mode: str) -> int:
    """Bytes a buffer needs to hold a ``width`` x ``height`` image in ``mode``."""
    _check_shape(width, height, mode)
    return ImageHeader(width, height, mode).total_size


def _check_shape(width: int, height: int, mode: str) -> None:
    if mode not in MODES:
        raise InvalidImage(f"image mode {mode!r} cannot be stored; use one of {sorted(MODES)}")
    if not (1 <= width <= _MAX_DIM and 1 <= height <= _MAX_DIM):
        raise InvalidImage(f"image size {width}x{height} is not storable (each side 1..2**32-1)")


def _bytes_view(buf: memoryview) -> memoryview:
    """``buf`` as a flat byte view; multi-dimensional or typed views are a caller bug."""
    if not isinstance(buf, memoryview):
        buf = memoryview(buf)
    if not buf.c_contiguous:
        raise TypeError("image buffer must be C-contiguous")
    if buf.format != "B" or buf.ndim != 1:
        buf = buf.cast("B")
    return buf


def read_header(buf: memoryview) -> ImageHeader:
    """Parse and strictly validate the header at the start of ``buf``."""
    buf = _bytes_view(buf)
    if len(buf) < HEADER_SIZE:
        raise InvalidImage(
            f"buffer of {len(buf)} bytes is shorter than the {HEADER_SIZE}-byte image header; "
            "was the image written with workflows.imagebuf.write_image?"
        )
    magic, width, height, raw_mode, nbytes = _HEADER.unpack_from(buf, 0)
    if magic != MAGIC:
        raise InvalidImage(
            f"buffer does not start with the image magic {MAGIC!r} (found {bytes(magic)!r}); "
            "it holds no image written by workflows.imagebuf.write_image, or it was overwritten"
        )
    mode = raw_mode.rstrip(b"\0").decode("ascii", "replace")
    _check_shape(width, height, mode)
    header = ImageHeader(width, height, mode)
    if nbytes != header.pixel_bytes:
        raise InvalidImage(
            f"header says {nbytes} pixel bytes but {width}x{height} {mode} needs "
            f"{header.pixel_bytes}; the header is corrupt"
        )
    if header.total_size > len(buf):
        raise InvalidImage(
            f"header describes a {width}x{height} {mode} image needing {header.total_size} "
            f"bytes but the buffer has only {len(buf)}; the buffer was truncated or resized"
        )
    return header


def write_image(buf: memoryview, img: Image.Image) -> int:
    """Store ``img`` at the start of ``buf``; return the bytes used (header + pixels).

    Other modes are converted first (see ``normalize_mode``). If the image does not fit,
    ``ResultTooLarge`` is raised *before* anything is written, so the old image stays intact.
    """
    buf = _bytes_view(buf)
    if buf.readonly:
        raise TypeError("write_image needs a writable buffer; got a read-only memoryview")
    img = normalize_mode(img)
    width, height = img.size
    _check_shape(width, height, img.mode)
    header = ImageHeader(width, height, img.mode)
    if header.total_size > len(buf):
        raise ResultTooLarge(header.total_size, len(buf), image=img)
    img.load()
    target = _mapped(buf, header)
    target.im.paste(img.im, (0, 0, width, height))  # one copy into place, nothing allocated
    del target  # the mapping holds an export of ``buf``: drop it before returning
    _HEADER.pack_into(buf, 0, MAGIC, width, height, img.mode.encode("ascii"), header.pixel_bytes)
    return header.total_size


def map_image(buf: memoryview) -> Image.Image:
    """A read-only Pillow image *over* the pixels in ``buf``: no copy, nothing allocated.

    The image holds ``buf`` exported for as long as it (or anything Pillow derived from it
    lazily) lives: a CDI object cannot be transferred, resized or destroyed meanwhile
    (``BufferInUse``). Drop it first, or use ``read_image`` for a copy that pins nothing.
    Pillow copies before any in-place change (``paste``, ``putpixel``, ``ImageDraw``), so the
    buffer is never written through it.
    """
    buf = _bytes_view(buf)
    image = _mapped(buf, read_header(buf))
    image.readonly = 1
    return image


def read_image(buf: memoryview) -> Image.Image:
    """Copy the image out of ``buf`` into a new Pillow image (the buffer can then move on)."""
    return map_image(buf).copy()


def _mapped(buf: memoryview, header: ImageHeader) -> Image.Image:
    """A Pillow image whose pixels are ``buf[HEADER_SIZE:]``, laid out as Pillow lays out its
    own (``frombuffer`` maps only modes of 1 or 4 bytes a pixel, and RGB is 4 inside Pillow)."""
    stride = header.width * PIXEL_BYTES[header.mode]
    core = _imaging.map_buffer(
        buf, (header.width, header.height), "raw", HEADER_SIZE, (header.mode, stride, 1)
    )
    return Image.new(header.mode, (0, 0))._new(core)


def image_view(buf: memoryview) -> tuple[ImageHeader, npt.NDArray[np.uint8]]:
    """Return the header and a numpy array *viewing* the pixels in place (no copy).

    Shape is ``(height, width)`` for ``L`` and ``(height, width, channels)`` otherwise. The
    array is writable when ``buf`` is. It keeps the buffer exported: drop it before the
    buffer is transferred, resized or released.
    """
    buf = _bytes_view(buf)
    header = read_header(buf)
    flat = np.frombuffer(buf, dtype=np.uint8, count=header.pixel_bytes, offset=HEADER_SIZE)
    if header.mode == "L":
        return header, flat.reshape(header.height, header.width)
    pixels = flat.reshape(header.height, header.width, PIXEL_BYTES[header.mode])
    return header, pixels[:, :, : header.channels]  # RGB: a strided view past the padding


def normalize_mode(img: Image.Image) -> Image.Image:
    """Map any Pillow mode onto ``L``, ``RGB`` or ``RGBA`` (returns ``img`` itself if already).

    Alpha survives (``LA``/``PA``/transparent palettes become ``RGBA``); 16/32-bit and float
    greyscale is scaled, not clipped, to 8 bits; CMYK/YCbCr/LAB/HSV become ``RGB``.
    """
    mode = img.mode
    if mode in MODES:
        return img
    if mode == "1":
        return img.convert("L")
    if mode == "P":
        return img.convert("RGBA" if "transparency" in img.info else "RGB")
    if mode in ("LA", "La", "PA", "RGBa"):
        return img.convert("RGBA")
    if mode.startswith("I") or mode == "F":
        return _scale_to_l(img)
    try:
        return img.convert("RGB")
    except (ValueError, OSError) as exc:
        raise InvalidImage(f"cannot convert image mode {mode!r} to RGB: {exc}") from exc


def _scale_to_l(img: Image.Image) -> Image.Image:
    """High-bit-depth greyscale to 8 bits by its nominal range (Pillow's convert clips)."""
    arr = np.asarray(img).astype(np.float64)
    if img.mode == "F":
        top = 1.0 if arr.size == 0 or float(arr.max()) <= 1.0 else 255.0
    else:
        top = 255.0 if arr.size == 0 or float(arr.max()) <= 255 else 65535.0
    scaled = np.clip(np.rint(arr * (255.0 / top)), 0, 255).astype(np.uint8)
    return Image.fromarray(scaled, mode="L")


def decode_bytes(data: bytes, max_pixels: int = DEFAULT_MAX_PIXELS) -> Image.Image:
    """Decode an encoded image file (JPEG, PNG, …) into an ``L``/``RGB``/``RGBA`` image.

    The pixel count is checked against ``max_pixels`` from the file header, *before* any pixel
    is decoded, so a decompression bomb costs nothing. EXIF orientation is applied (the result
    is what a viewer shows); of an animation, only the first frame is kept. Pillow's own bomb
    ceiling (``2 * Image.MAX_IMAGE_PIXELS``) still applies above ``max_pixels``.
    """
    return finish_decode(open_image(data, max_pixels))


def open_image(data: bytes, max_pixels: int = DEFAULT_MAX_PIXELS) -> Image.Image:
    """The first half of ``decode_bytes``: the file's header read and checked, no pixel
    decoded yet. Finish with ``finish_decode``, or ``decode_into`` if ``decodes_in_place``."""
    if max_pixels < 1:
        raise ValueError(f"max_pixels must be >= 1, got {max_pixels}")
    if not data:
        raise InvalidImage("empty input: expected the bytes of an image file (JPEG, PNG, …)")
    with _decoding(data):
        img = _open(data, max_pixels)
        width, height = img.size
        if width * height > max_pixels:
            raise InvalidImage(_bomb_message(width, height, max_pixels))
        return img


def finish_decode(img: Image.Image) -> Image.Image:
    """Decode the pixels of an ``open_image`` result, upright and in a stored mode."""
    with _decoding(None):
        img.load()
        ImageOps.exif_transpose(img, in_place=True)
        return normalize_mode(img)


def decodes_in_place(img: Image.Image) -> bool:
    """Whether ``decode_into`` can take this ``open_image`` result: a JPEG in a stored mode
    (``L`` or ``RGB``; CMYK needs a conversion) that no EXIF orientation turns."""
    if img.format != "JPEG" or img.mode not in ("L", "RGB"):
        return False
    with _decoding(None):
        return bool(img.getexif().get(_ORIENTATION, 1) == 1)


def decode_into(buf: memoryview, img: Image.Image) -> int:
    """Decode an ``open_image`` result for which ``decodes_in_place`` holds straight into
    ``buf``, as ``write_image(buf, finish_decode(img))`` would store it, without the decoded
    image in between (one pass over the pixels instead of two);
    return the bytes used. ``img`` is spent afterwards."""
    if not decodes_in_place(img):
        raise ValueError("decode_into takes a JPEG in mode L or RGB with no EXIF rotation")
    buf = _bytes_view(buf)
    if buf.readonly:
        raise TypeError("decode_into needs a writable buffer; got a read-only memoryview")
    width, height = img.size
    header = ImageHeader(width, height, img.mode)
    if header.total_size > len(buf):
        raise ValueError(f"buffer of {len(buf)} bytes is too small; required_size() is the size")
    target = _mapped(buf, header)
    try:
        img.im = target.im  # Pillow's loader decodes into an image it is given (load_prepare)
        with _decoding(None):
            img.load()
    except BaseException as exc:
        # The frames of a failed load hold Pillow's decoder, which holds the mapped image:
        # clear them, or the caller could not release (or transfer, or destroy) ``buf``.
        clear_frames(exc)
        raise
    finally:
        img.close()  # drops the mapped image, so ``buf`` is no longer exported
        del target
    _HEADER.pack_into(buf, 0, MAGIC, width, height, header.mode.encode("ascii"), header.pixel_bytes)
    return header.total_size


@contextlib.contextmanager
def _decoding(data: bytes | None) -> Iterator[None]:
    """Pillow's errors while reading an image file, as ``InvalidImage``."""
    try:
        yield
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise InvalidImage(f"refusing a possible decompression bomb: {exc}") from exc
    except UnidentifiedImageError as exc:
        start = bytes(data[:8]) if data is not None else b""
        raise InvalidImage(
            f"not a recognised image file ({len(data or b'')} bytes starting {start!r})"
        ) from exc
    except InvalidImage:
        raise
    # Truncated or corrupt files surface from Pillow's decoders as any of these.
    except (OSError, ValueError, SyntaxError, EOFError, struct.error) as exc:
        raise InvalidImage(f"image file is corrupt or truncated: {exc}") from exc


def _open(data: bytes, max_pixels: int) -> Image.Image:
    if max_pixels <= (Image.MAX_IMAGE_PIXELS or 0):
        # Pillow warns only above its own limit, which is then above ours: the warning (or the
        # error it becomes under -W error) is translated by the caller.
        return Image.open(io.BytesIO(data))
    # Our limit is the one that counts. catch_warnings is process-global, so it is only
    # entered in this rare configuration.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        return Image.open(io.BytesIO(data))


def _bomb_message(width: int, height: int, max_pixels: int) -> str:
    return (
        f"image is {width}x{height} = {width * height} pixels, over the limit of {max_pixels}; "
        "refusing it as a possible decompression bomb (raise max_pixels if it is genuine)"
    )


def encode_image(img: Image.Image, fmt: str = "PNG", quality: int = JPEG_RESULT_QUALITY) -> bytes:
    """Encode ``img`` as ``PNG`` or ``TIFF`` (lossless, uncompressed; ``quality`` ignored by
    both) or ``JPEG`` (``quality`` 1-95).

    JPEG has no alpha, so ``RGBA`` is flattened onto white first.
    """
    fmt = fmt.upper()
    if fmt == "JPG":
        fmt = "JPEG"
    if fmt not in ("PNG", "JPEG", "TIFF"):
        raise ValueError(f"unsupported encode format {fmt!r}; use 'PNG', 'TIFF' or 'JPEG'")
    img = normalize_mode(img)
    out = io.BytesIO()
    if fmt == "PNG":
        img.save(out, format="PNG", compress_level=PNG_COMPRESS_LEVEL)
        return out.getvalue()
    if fmt == "TIFF":
        img.save(out, format="TIFF", compression="raw")
        return out.getvalue()
    if not 1 <= quality <= 95:
        raise ValueError(f"JPEG quality must be 1..95, got {quality}")
    if img.mode == "RGBA":
        flat = Image.new("RGB", img.size, (255, 255, 255))
        flat.paste(img, mask=img.getchannel("A"))
        img = flat
    img.save(out, format="JPEG", quality=quality)
    return out.getvalue()
