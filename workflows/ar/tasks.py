"""The AR application as workflow tasks: decode a video, detect people per chunk of frames
(a ``for_each`` fan-out), combine the labelled frames into the output video.

The bundled ``ar_video`` definition (``workflows.definitions``) wires them::

    decode (input.data.video: an S3 URI) -> detect[0..n-1] (one chunk each) -> combine

Frames travel as CDI objects of kind ``array``: ``decode`` makes one object per chunk, an
array of ``frames_per_step`` x height x width x 3 BGR pixels; each ``detect`` maps its chunk
read-only, draws on a copy and hands that on; ``combine`` gets every chunk in order and
encodes them. The output video is the bytes output ``video`` (H.264 in MP4), stored in S3 as
the run's result, and ``boxes`` (JSON) lists every frame's detections in order.

*Why a chunk size, default 1:* a step run costs the orchestrator a few milliseconds (a row,
two queue messages, an object hand-off) against ~50 ms of detection a frame, so one frame a
step keeps the fan-out finest (balanced over every worker, each frame visible on its own);
a longer video may take several frames a step to keep its step runs few.

The whole video is decoded into objects before detection starts (a step's outputs exist once
it ends), so ``decode`` refuses more than ``MAX_FRAMES`` frames; ``input.data.frames`` cuts a
longer video short.
"""

from __future__ import annotations

import itertools
import tempfile
from fractions import Fraction
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from workflows.api import TaskContext, task
from workflows.ar.detector import PeopleDetector, draw_boxes
from workflows.ar.video import VideoWriter, probe, read_frames
from workflows.errors import InvalidVideo

__all__ = [
    "MAX_FRAMES",
    "ar_combine",
    "ar_combine_stream",
    "ar_decode",
    "ar_decode_stream",
    "ar_detect",
    "ar_detect_stream",
    "chunks_of",
    "combine_chunks",
    "detect_chunk",
]

MAX_FRAMES: Final = 500  # 20 s at 25 fps; at 640x360 about 350 MB of frames in CDI objects
Chunk = npt.NDArray[np.uint8]  # frames x height x width x 3, BGR

_detectors: dict[int, PeopleDetector] = {}  # one per detect width: the model loads once


def _positive_int(value: Any, what: str, default: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidVideo(f"{what} must be a positive integer, got {value!r}")
    return value


def _fetch(uri: Any, ctx: TaskContext) -> bytes:
    """The video at ``uri``, read by the worker (``TaskContext.read_file``)."""
    if not isinstance(uri, str) or not uri.startswith("s3://"):
        raise InvalidVideo(f"input.data.video must be the s3:// URI of a video, got {uri!r}")
    return ctx.read_file(uri)


def chunks_of(path: str | Path, frames_per_step: int, limit: int | None) -> list[Chunk]:
    """The video at ``path`` as arrays of ``frames_per_step`` frames (the last may be short)."""
    frames = list(read_frames(path, limit if limit is not None else MAX_FRAMES + 1))
    if not frames:
        raise InvalidVideo("the video has no frames")
    if len(frames) > MAX_FRAMES:
        raise InvalidVideo(
            f"the video has more than {MAX_FRAMES} frames; pass input.data.frames (at most "
            f"{MAX_FRAMES}) to take its first ones"
        )
    return [
        np.stack(frames[i : i + frames_per_step]) for i in range(0, len(frames), frames_per_step)
    ]


@task(name="ar_decode", timeout_s=120, retries=1, needs_image=False)
def ar_decode(ctx: TaskContext) -> dict[str, Any]:
    """Decode ``input.data.video`` (at most ``input.data.frames`` frames) into chunks of
    ``params.frames_per_step`` frames: the list ``frames``, and ``fps`` as [num, den]."""
    per_step = _positive_int(ctx.params.get("frames_per_step"), "params.frames_per_step", 1)
    limit = ctx.input.get("frames")
    if limit is not None:
        limit = _positive_int(limit, "input.data.frames", MAX_FRAMES)
    data = _fetch(ctx.input.get("video"), ctx)
    with tempfile.TemporaryDirectory(prefix="cdiflow-ar-") as folder:
        path = Path(folder) / "in"
        path.write_bytes(data)
        fps = probe(path).fps
        chunks = chunks_of(path, per_step, limit)
    ctx.logger.info("decoded %d chunks of up to %d frames", len(chunks), per_step)
    return {"frames": chunks, "fps": [fps.numerator, fps.denominator]}


def detect_chunk(frames: Chunk, detect_width: int = 640) -> tuple[Chunk, list[list[list[float]]]]:
    """People in each frame of ``frames`` (read only), and a copy with their labelled boxes."""
    detector = _detectors.get(detect_width)
    if detector is None:
        detector = _detectors[detect_width] = PeopleDetector(detect_width)
    drawn = np.array(frames, copy=True)
    boxes = []
    for frame in drawn:
        found = detector.detect(frame)
        draw_boxes(frame, found)
        boxes.append([box.as_list() for box in found])
    return drawn, boxes


@task(name="ar_detect", timeout_s=60, retries=2, needs_image=False)
def ar_detect(frames: Chunk, ctx: TaskContext) -> dict[str, Any]:
    """One chunk's frames with people boxed (``frames``) and the boxes per frame (``boxes``)."""
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
        raise InvalidVideo(f"expected frames x height x width x 3 uint8, got {frames.shape}")
    width = _positive_int(ctx.params.get("detect_width"), "params.detect_width", 640)
    drawn, boxes = detect_chunk(frames, width)
    return {"frames": drawn, "boxes": boxes}


def combine_chunks(chunks: list[Chunk], fps: Fraction, path: Path) -> int:
    """Encode ``chunks`` in order into the video file ``path``; the frames written."""
    height, width = chunks[0].shape[1:3]
    with VideoWriter(path, width, height, fps) as writer:
        for chunk in chunks:
            for frame in chunk:
                writer.write(frame)
        return writer.frames


@task(name="ar_combine", timeout_s=120, retries=1, needs_image=False)
def ar_combine(
    frames: list[Chunk], boxes: list[list[list[list[float]]]], fps: list[int], ctx: TaskContext
) -> dict[str, Any]:
    """The output video (``video``, MP4 bytes) and every frame's boxes in order (``boxes``)."""
    if not frames:
        raise InvalidVideo("no frames to combine")
    with tempfile.TemporaryDirectory(prefix="cdiflow-ar-") as folder:
        path = Path(folder) / "out.mp4"
        count = combine_chunks(frames, Fraction(*fps), path)
        video = path.read_bytes()
    every = [frame for chunk in boxes for frame in chunk]
    ctx.logger.info("encoded %d frames, %d bytes", count, len(video))
    return {"video": video, "boxes": every, "frame_count": count}


# --- the streaming variant (``ar_video_stream``): frames flow over channels ----------------
#
#   decode --frames<i>--> detect<i> --labelled<i>--> combine        (i = 0 .. detectors-1)
#          --meta-----------------------------------> combine
#
# ``decode`` deals frame k to channel ``params.to[k % n]``; detector i sends each labelled
# frame and then its boxes (JSON) on its own channel; ``combine`` takes frame k from
# ``params.from[k % n]`` (every stream is in order), so the output is in the video's order,
# encoded as it comes. ``meta`` carries the frame rate ahead of the first frame. No step
# holds the whole video: no ``MAX_FRAMES``.


def _channel_names(ctx: TaskContext, name: str) -> list[str]:
    names = ctx.params.get(name)
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise InvalidVideo(f"params.{name} must be a non-empty list of channel names")
    return names


@task(name="ar_decode_stream", timeout_s=600, needs_image=False)
def ar_decode_stream(img: None, ctx: TaskContext) -> dict[str, Any]:
    """Decode ``input.data.video`` (its first ``input.data.frames`` frames, when given), dealing
    frame k to channel ``params.to[k % n]``; the frame rate goes first on ``meta``."""
    outputs = [ctx.channels.publish(name) for name in _channel_names(ctx, "to")]
    meta = ctx.channels.publish("meta")
    limit = ctx.input.get("frames")
    if limit is not None:
        limit = _positive_int(limit, "input.data.frames", 1)
    data = _fetch(ctx.input.get("video"), ctx)
    count = 0
    with tempfile.TemporaryDirectory(prefix="cdiflow-ar-") as folder:
        path = Path(folder) / "in"
        path.write_bytes(data)
        fps = probe(path).fps
        meta.send({"fps": [fps.numerator, fps.denominator]})
        for frame in read_frames(path, limit):
            outputs[count % len(outputs)].send(frame)
            count += 1
    if not count:
        raise InvalidVideo("the video has no frames")
    ctx.logger.info("decoded %d frames onto %d channels", count, len(outputs))
    return {"frame_count": count}


@task(name="ar_detect_stream", timeout_s=600, needs_image=False)
def ar_detect_stream(img: None, ctx: TaskContext) -> dict[str, Any]:
    """Box the people in every frame of channel ``params.from``, sending each labelled frame
    and then its boxes on ``params.to``."""
    width = _positive_int(ctx.params.get("detect_width"), "params.detect_width", 640)
    out = ctx.channels.publish(str(ctx.params.get("to")))
    count = 0
    for frame in ctx.channels.subscribe(str(ctx.params.get("from"))):
        if not isinstance(frame, np.ndarray) or frame.ndim != 3 or frame.shape[-1] != 3:
            raise InvalidVideo(f"expected height x width x 3 frames, got {type(frame).__name__}")
        drawn, boxes = detect_chunk(frame[None], width)
        out.send(drawn[0])
        out.send(boxes[0])
        count += 1
    return {"frames": count}


@task(name="ar_combine_stream", timeout_s=600, needs_image=False)
def ar_combine_stream(img: None, ctx: TaskContext) -> dict[str, Any]:
    """Encode the labelled frames of channels ``params.from`` (frame k from the k % n-th) as
    they come: the output video (``video``), every frame's boxes (``boxes``) and
    ``frame_count``, as ``ar_combine`` gives them."""
    streams = [iter(ctx.channels.subscribe(name)) for name in _channel_names(ctx, "from")]
    meta = next(iter(ctx.channels.subscribe("meta")), None)
    if not isinstance(meta, dict) or "fps" not in meta:
        raise InvalidVideo("the decode step ended before it said the video's frame rate")
    fps = Fraction(*meta["fps"])
    every: list[list[list[float]]] = []
    writer: VideoWriter | None = None
    with tempfile.TemporaryDirectory(prefix="cdiflow-ar-") as folder:
        path = Path(folder) / "out.mp4"
        try:
            for k in itertools.count():
                stream = streams[k % len(streams)]
                frame = next(stream, None)
                if frame is None:
                    break  # the streams end in turn: the video is over
                boxes = next(stream)
                if writer is None:
                    height, width = frame.shape[:2]
                    writer = VideoWriter(path, width, height, fps)
                writer.write(frame)
                every.append(boxes)
            for stream in streams:  # every other stream has ended too
                if next(stream, None) is not None:
                    raise InvalidVideo("a detector sent more frames than its turn")
        finally:
            if writer is not None:
                writer.close()
        if writer is None:
            raise InvalidVideo("no frames to combine")
        count = writer.frames
        video = path.read_bytes()
    ctx.logger.info("encoded %d frames, %d bytes", count, len(video))
    return {"video": video, "boxes": every, "frame_count": count}
