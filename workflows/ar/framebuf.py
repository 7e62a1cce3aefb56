"""One frame of the AR application as a flat message: header, boxes, pixels.

Every version of the application moves frames in this layout: the bytes of a TCP message, a
REST body and a gRPC message, and the memory of a CDI object. A detector writes its boxes
into the same buffer it draws on, so a frame and what was found in it travel together.

    offset  size                 field
    0       48                   header: magic, flags, box count, sequence number,
                                 when the extractor read it (ns, CLOCK_MONOTONIC), height,
                                 width, channels
    48      MAX_BOXES x 20       boxes: x, y, w, h (int32), score (float32)
    704     height*width*3       pixels, BGR, row after row

The pixel offset is a multiple of 64, so the pixels start on a cache line. An *end* message
(``END`` flag) carries no pixels that matter; a stream of F frames over N detectors ends with
N of them, numbered F to F+N-1, so every detector gets one and passes it on.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

from workflows.ar.boxes import Box
from workflows.errors import InvalidVideo

__all__ = [
    "END",
    "MAX_BOXES",
    "PIXELS_OFFSET",
    "FrameHeader",
    "message_size",
    "pixels",
    "read_boxes",
    "read_header",
    "start_frame",
    "write_boxes",
    "write_end",
    "write_frame",
]

Frame = npt.NDArray[np.uint8]
_MAGIC: Final = b"CDIARFR1"
_HEADER: Final = struct.Struct("<8sIIqqIIII")
_BOX: Final = struct.Struct("<iiiif")
MAX_BOXES: Final = 32
PIXELS_OFFSET: Final = 704
END: Final = 1
assert _HEADER.size <= 48 and 48 + MAX_BOXES * _BOX.size <= PIXELS_OFFSET


@dataclass(frozen=True)
class FrameHeader:
    flags: int
    boxes: int
    seq: int
    t0_ns: int
    height: int
    width: int
    channels: int

    @property
    def end(self) -> bool:
        return bool(self.flags & END)


def message_size(width: int, height: int) -> int:
    """Bytes of a message carrying one ``width`` x ``height`` BGR frame."""
    return PIXELS_OFFSET + width * height * 3


def read_header(buf: memoryview | bytes | bytearray) -> FrameHeader:
    if len(buf) < PIXELS_OFFSET:
        raise InvalidVideo(f"a frame message has at least {PIXELS_OFFSET} bytes, got {len(buf)}")
    magic, flags, boxes, seq, t0, height, width, channels, _ = _HEADER.unpack_from(buf)
    if magic != _MAGIC:
        raise InvalidVideo(f"not a frame message (magic {magic!r})")
    header = FrameHeader(flags, boxes, seq, t0, height, width, channels)
    if not header.end and (channels != 3 or len(buf) < message_size(width, height)):
        raise InvalidVideo(
            f"a {width}x{height}x{channels} frame does not fit a {len(buf)}-byte message"
        )
    return header


def _write_header(buf: memoryview | bytearray, header: FrameHeader) -> None:
    _HEADER.pack_into(
        buf,
        0,
        _MAGIC,
        header.flags,
        header.boxes,
        header.seq,
        header.t0_ns,
        header.height,
        header.width,
        header.channels,
        0,
    )


def start_frame(
    buf: memoryview | bytearray, seq: int, t0_ns: int, height: int, width: int
) -> Frame:
    """Make ``buf`` frame ``seq`` (no boxes yet); its pixels, to be filled, as an array."""
    if len(buf) < message_size(width, height):
        raise InvalidVideo(f"a {width}x{height} frame does not fit a {len(buf)}-byte buffer")
    _write_header(buf, FrameHeader(0, 0, seq, t0_ns, height, width, 3))
    return pixels(buf, height, width)


def write_frame(buf: memoryview | bytearray, seq: int, t0_ns: int, frame: Frame) -> None:
    """Put ``frame`` (H x W x 3) into ``buf`` as frame ``seq``, with no boxes yet."""
    np.copyto(start_frame(buf, seq, t0_ns, frame.shape[0], frame.shape[1]), frame)


def write_end(buf: memoryview | bytearray, seq: int) -> None:
    """Make ``buf`` the end message numbered ``seq``."""
    _write_header(buf, FrameHeader(END, 0, seq, 0, 0, 0, 0))


def pixels(buf: memoryview | bytes | bytearray, height: int, width: int) -> Frame:
    """The frame in ``buf`` as an H x W x 3 array over the buffer's memory (no copy)."""
    count = height * width * 3
    flat = np.frombuffer(buf, dtype=np.uint8, count=count, offset=PIXELS_OFFSET)
    return flat.reshape(height, width, 3)


def write_boxes(buf: memoryview | bytearray, boxes: Sequence[Box]) -> None:
    """Record ``boxes`` (the first ``MAX_BOXES``) in the header of the frame in ``buf``."""
    kept = boxes[:MAX_BOXES]
    for i, box in enumerate(kept):
        _BOX.pack_into(buf, 48 + i * _BOX.size, box.x, box.y, box.w, box.h, box.score)
    struct.pack_into("<I", buf, 12, len(kept))


def read_boxes(buf: memoryview | bytes | bytearray, header: FrameHeader) -> list[Box]:
    return [Box(*_BOX.unpack_from(buf, 48 + i * _BOX.size)) for i in range(header.boxes)]
