"""Video in and out for the AR application, through PyAV.

*Why PyAV:* its wheels carry FFmpeg's libraries with their codecs (H.264 through libx264
included), so nothing is downloaded or installed besides the wheel, and decoding runs inside
the calling process into NumPy arrays. imageio-ffmpeg, the other wheel that ships FFmpeg, runs
the ``ffmpeg`` program as a child and pipes raw frames through it: every frame would cross a
pipe twice, a data movement of its own in a benchmark that measures data movement, and the
child's CPU would belong to no role.

Frames are BGR, ``uint8``, height x width x 3 (OpenCV's order). Between the codecs' YUV 4:2:0
and BGR, OpenCV converts (``cv2.cvtColor``), not FFmpeg's swscale: swscale spreads a
conversion over threads of its own, whose CPU no thread-level timer of the caller sees, and
OpenCV writes the BGR pixels straight into a buffer the caller chooses (a frame message, a CDI
object), so no copy follows. The codecs run on one thread each: the application's
parallelism is its processes (see ``workflows.ar.detector``), and a single-threaded H.264
encoder gives the same bytes for the same frames in every run.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from types import TracebackType
from typing import Any, cast

import av
import av.error
import cv2
import numpy as np
import numpy.typing as npt

from workflows.ar.threads import opencv_single_threaded
from workflows.errors import InvalidVideo

__all__ = ["VideoInfo", "VideoWriter", "decode", "probe", "read_frames", "to_bgr"]

Frame = npt.NDArray[np.uint8]
DEFAULT_CODEC = "libx264"
# ultrafast: the combinator encodes every frame on the same two cores the detectors use.
DEFAULT_OPTIONS = {"preset": "ultrafast", "crf": "23"}


@dataclass(frozen=True)
class VideoInfo:
    width: int
    height: int
    fps: Fraction
    frames: int
    """Frames the container declares (0 when it does not say)."""

    @property
    def frame_bytes(self) -> int:
        """Bytes of one decoded BGR frame."""
        return self.width * self.height * 3


def _open(path: str | Path) -> Any:
    try:
        container = av.open(str(path), "r")
    except FileNotFoundError as exc:
        raise InvalidVideo(f"no video file at {path}") from exc
    except (av.error.FFmpegError, OSError) as exc:
        raise InvalidVideo(f"{path} is not a video FFmpeg can read: {exc}") from exc
    if not container.streams.video:
        container.close()
        raise InvalidVideo(f"{path} has no video stream")
    return container


def probe(path: str | Path) -> VideoInfo:
    """Size, frame rate and declared frame count of the first video stream of ``path``."""
    container = _open(path)
    try:
        stream = container.streams.video[0]
        rate = stream.average_rate or stream.guessed_rate or Fraction(25)
        return VideoInfo(stream.width, stream.height, Fraction(rate), int(stream.frames or 0))
    finally:
        container.close()


def decode(path: str | Path, limit: int | None = None) -> Iterator[av.VideoFrame]:
    """Decode ``path``'s first video stream; frames as FFmpeg gives them (see ``to_bgr``)."""
    opencv_single_threaded()
    container = _open(path)
    try:
        stream = container.streams.video[0]
        stream.codec_context.thread_count = 1
        for count, frame in enumerate(container.decode(stream)):
            if limit is not None and count >= limit:
                return
            yield frame
    except av.error.FFmpegError as exc:
        raise InvalidVideo(f"{path} could not be decoded: {exc}") from exc
    finally:
        container.close()


def to_bgr(frame: av.VideoFrame, out: Frame | None = None) -> Frame:
    """The decoded ``frame`` as BGR pixels, written into ``out`` when given (H x W x 3)."""
    if frame.format.name != "yuv420p":
        frame = frame.reformat(format="yuv420p")  # other sources: swscale, once
    yuv = frame.to_ndarray()  # the three planes, packed: (H * 3/2) x W
    if out is not None and out.shape != (frame.height, frame.width, 3):
        raise InvalidVideo(
            f"a {frame.width}x{frame.height} frame does not fit an array of shape {out.shape}"
        )
    return cast(Frame, cv2.cvtColor(yuv, cv2.COLOR_YUV2BGR_I420, dst=out))


def read_frames(path: str | Path, limit: int | None = None) -> Iterator[Frame]:
    """Decode ``path``'s first video stream into BGR frames, one new array each."""
    for frame in decode(path, limit):
        yield to_bgr(frame)


class VideoWriter:
    """Encodes BGR frames of one size into a video file (H.264 in MP4 by default)."""

    def __init__(
        self,
        path: str | Path,
        width: int,
        height: int,
        fps: Fraction | int = 25,
        codec: str = DEFAULT_CODEC,
        options: dict[str, str] | None = None,
    ) -> None:
        if width <= 0 or height <= 0 or width % 2 or height % 2:
            raise InvalidVideo(f"a {width}x{height} frame cannot be encoded: use even sides")
        opencv_single_threaded()
        self.path = Path(path)
        self.width, self.height = width, height
        self.frames = 0
        self._container: Any = av.open(str(self.path), "w")
        try:
            stream = self._container.add_stream(codec, rate=Fraction(fps))
            if not isinstance(stream, av.VideoStream):
                raise InvalidVideo(f"{codec} is not a video codec")
            stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
            stream.options = dict(DEFAULT_OPTIONS if options is None else options)
            stream.codec_context.thread_count = 1
        except BaseException:
            self._container.close()
            raise
        self._stream = stream
        self._yuv = np.empty((height * 3 // 2, width), np.uint8)

    def write(self, frame: Frame) -> None:
        """Encode one frame; the array may be reused as soon as this returns."""
        if frame.shape != (self.height, self.width, 3):
            raise InvalidVideo(
                f"frame of shape {frame.shape} does not fit a {self.width}x{self.height} video"
            )
        cv2.cvtColor(frame, cv2.COLOR_BGR2YUV_I420, dst=self._yuv)
        video_frame = av.VideoFrame.from_ndarray(self._yuv, format="yuv420p")
        video_frame.pts = self.frames
        for packet in self._stream.encode(video_frame):
            self._container.mux(packet)
        self.frames += 1

    def close(self) -> None:
        """Flush the encoder and finish the file."""
        if self._container is None:
            return
        try:
            for packet in self._stream.encode(None):
                self._container.mux(packet)
        finally:
            self._container.close()
            self._container = None

    def __enter__(self) -> VideoWriter:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
