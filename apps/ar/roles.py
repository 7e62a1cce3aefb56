"""The three roles, written once against ``apps.ar.links``; the two references; and the
process each runs in.

A role process opens its end of the pipeline, says it is ready (with its address), connects
to the peers the launcher sends, says so, waits for ``go`` and runs. What it reports is
measured from ``go`` to its end: the CPU time of the whole process (every thread: a server's
too), split into the application's own work (``compute_s``), moving frames (``link_s`` and
``threads_s``) and the rest, its peak RSS, and for the combinator each frame's latency and
boxes.
"""

from __future__ import annotations

import os
import tempfile
import time
import traceback
from collections.abc import Callable
from contextlib import ExitStack, suppress
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np
import psutil

from apps.ar.config import RunConfig
from apps.ar.links import CombinatorEnd, DetectorEnd, ExtractorEnd, Peers, backend
from workflows.ar import framebuf
from workflows.ar.detector import PeopleDetector, draw_boxes
from workflows.ar.video import Frame, VideoWriter, decode, probe, read_frames, to_bgr

__all__ = [
    "ROLES",
    "LinkMeter",
    "RoleStats",
    "combine",
    "detect",
    "extract",
    "floor",
    "pool_detect",
    "role_main",
]

# The pipeline's three roles, and the two references: ``floor`` is the whole application in
# one process; ``pool`` is one of N processes that only detect, on frames they already hold.
ROLES = ("extractor", "detector", "combinator", "floor", "pool")


@dataclass
class RoleStats:
    role: str
    index: int
    cpu_s: float
    """CPU time of the whole process from ``go`` to its end."""
    peak_rss: int
    """Peak resident memory of the process, bytes (since it started: ``VmHWM``)."""
    base_rss: int
    """Resident memory with the code loaded, before setting anything up (model, encoder, its
    end of the pipeline), bytes: the fixed part of what the role holds."""
    frames: int
    go_ns: int
    end_ns: int
    compute_s: float = 0.0
    """CPU time of this process's thread inside the application's own work (decode, detect
    and draw, encode): what the floor does too."""
    link_s: float = 0.0
    """CPU time of this process's thread inside its end of the pipeline (``slot``, ``send``,
    ``receive``, ``forward``, ``release``, ``close``): moving frames."""
    threads_s: float = 0.0
    """CPU time of the process's other threads from ``go`` to its end: the link's own (a
    gRPC or HTTP server, a client's I/O threads), as the codecs and OpenCV run on the
    calling thread (``workflows.ar.threads``); moving frames too. What ``cpu_s`` holds
    besides ``compute_s``, ``link_s`` and ``threads_s`` is the role's own loop: message
    headers, boxes, latencies."""
    latencies_ns: list[int] = field(default_factory=list)
    boxes: list[list[list[float]]] = field(default_factory=list)
    network_namespace: int = 0
    """The inode of the process's network namespace: which host it ran on."""


class LinkMeter:
    """``with link:`` around a call to the role's end adds the calling thread's CPU time in
    it to ``stats.link_s`` (a thread's clock: time spent waiting costs nothing)."""

    __slots__ = ("_started", "_stats")

    def __init__(self, stats: RoleStats) -> None:
        self._stats = stats
        self._started = 0

    def __enter__(self) -> None:
        self._started = time.thread_time_ns()

    def __exit__(self, *exc: object) -> None:
        self._stats.link_s += (time.thread_time_ns() - self._started) / 1e9


def extract(end: ExtractorEnd, config: RunConfig, stats: RoleStats) -> None:
    """Decode the video into frame messages for the detectors in turn; then one end message
    for each detector."""
    frames = decode(config.video, config.frames)
    link = LinkMeter(stats)
    seq = 0
    while True:
        started = time.perf_counter_ns()  # a frame's latency includes its decode
        cpu = time.thread_time()
        decoded = next(frames, None)
        stats.compute_s += time.thread_time() - cpu
        if decoded is None:
            break
        with link:
            message = end.slot(seq)
        pixels = framebuf.start_frame(message, seq, started, decoded.height, decoded.width)
        cpu = time.thread_time()
        to_bgr(decoded, out=pixels)  # straight into the message: no copy
        stats.compute_s += time.thread_time() - cpu
        del pixels, message
        with link:
            end.send(seq)
        seq += 1
    for last in range(seq, seq + config.detectors):
        with link:
            message = end.slot(last)
        framebuf.write_end(message, last)
        del message
        with link:
            end.send(last)
    stats.frames = seq


def detect(end: DetectorEnd, detector: PeopleDetector, stats: RoleStats) -> None:
    """Find people in each frame that comes, draw them on it in place, record the boxes in
    its header and pass it on; pass the end message on and stop."""
    link = LinkMeter(stats)
    while True:
        with link:
            message = end.receive()
        header = framebuf.read_header(message)
        if not header.end:
            frame = framebuf.pixels(message, header.height, header.width)
            cpu = time.thread_time()
            boxes = detector.detect(frame)
            draw_boxes(frame, boxes)
            stats.compute_s += time.thread_time() - cpu
            framebuf.write_boxes(message, boxes)
            del frame  # no array may hold a CDI object's memory when it is handed on
            stats.frames += 1
        del message
        with link:
            end.forward()
        if header.end:
            return


def combine(end: CombinatorEnd, config: RunConfig, writer: VideoWriter, stats: RoleStats) -> None:
    """Encode the frames in order; record each one's latency and boxes; stop at the first
    end message after taking every detector's."""
    link = LinkMeter(stats)
    seq = 0
    while True:
        with link:
            message = end.receive(seq)
        header = framebuf.read_header(message)
        if header.end:
            del message
            with link:
                end.release(seq)
                for other in range(seq + 1, seq + config.detectors):
                    end.receive(other)
                    end.release(other)
            return
        frame = framebuf.pixels(message, header.height, header.width)
        cpu = time.thread_time()
        writer.write(frame)
        stats.compute_s += time.thread_time() - cpu
        stats.boxes.append([box.as_list() for box in framebuf.read_boxes(message, header)])
        del frame, message
        with link:
            end.release(seq)
        stats.latencies_ns.append(time.perf_counter_ns() - header.t0_ns)
        stats.frames += 1
        seq += 1


def floor(
    config: RunConfig, detector: PeopleDetector, writer: VideoWriter, stats: RoleStats
) -> None:
    """The whole application in one process, nothing moved: decode, detect, draw, encode."""
    frames = decode(config.video, config.frames)
    frame = np.empty((config.height, config.width, 3), np.uint8)  # one buffer, reused
    while True:
        started = time.perf_counter_ns()
        cpu = time.thread_time()
        decoded = next(frames, None)
        if decoded is None:
            stats.compute_s += time.thread_time() - cpu
            return
        to_bgr(decoded, out=frame)
        boxes = detector.detect(frame)
        draw_boxes(frame, boxes)
        writer.write(frame)
        stats.compute_s += time.thread_time() - cpu
        stats.boxes.append([box.as_list() for box in boxes])
        stats.latencies_ns.append(time.perf_counter_ns() - started)
        stats.frames += 1


def pool_share(config: RunConfig, index: int, workers: int) -> list[Frame]:
    """The frames worker ``index`` of ``workers`` detects in the pool: every ``workers``-th."""
    return [
        frame
        for seq, frame in enumerate(read_frames(config.video, config.frames))
        if seq % workers == index
    ]


def pool_detect(frames: list[Frame], detector: PeopleDetector, stats: RoleStats) -> None:
    """Detection alone: detect and draw on frames already in this process's memory."""
    for frame in frames:
        started = time.perf_counter_ns()
        cpu = time.thread_time()
        draw_boxes(frame, detector.detect(frame))
        stats.compute_s += time.thread_time() - cpu
        stats.latencies_ns.append(time.perf_counter_ns() - started)
        stats.frames += 1


def peak_rss(pid: int | str = "self") -> int:
    """A process's peak resident memory in bytes, from ``VmHWM``. Not ``ru_maxrss``: Linux
    carries that across ``fork`` and ``exec``, so a spawned role would inherit its parent's."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/{pid}/status has no VmHWM: peak memory is measured on Linux only")


def role_main(role: str, index: int, config: RunConfig, control: Connection) -> None:
    """The body of a role's process (see the module's docstring for the conversation)."""
    base_rss = psutil.Process().memory_info().rss
    try:
        with ExitStack() as cleanup:
            run = _set_up(role, index, config, cleanup)
            control.send(("ready", run.address))
            run.connect(control.recv())
            control.send(("connected", None))
            if control.recv() != "go":
                return
            stats = RoleStats(role, index, 0.0, 0, base_rss, 0, 0, 0)
            # The process's clock read before this thread's at the start and after it at
            # the end: the process's time then holds this thread's whole, so the other
            # threads' share (the difference) is never below zero.
            process_ns = time.process_time_ns()
            thread_ns = time.thread_time_ns()
            stats.go_ns = time.perf_counter_ns()
            run.body(stats)
            stats.end_ns = time.perf_counter_ns()
            thread_ns = time.thread_time_ns() - thread_ns
            process_ns = time.process_time_ns() - process_ns
            stats.cpu_s = process_ns / 1e9
            stats.threads_s = (process_ns - thread_ns) / 1e9
            stats.peak_rss = peak_rss()
            stats.network_namespace = os.stat("/proc/self/ns/net").st_ino
        control.send(("done", stats))
    except BaseException:
        with suppress(OSError):  # the launcher may be gone: then nobody is listening
            control.send(("error", traceback.format_exc()))
        raise SystemExit(1) from None


@dataclass
class _Run:
    body: Callable[[RoleStats], None]
    address: str = ""
    connect: Callable[[Peers], None] = lambda peers: None


def _close_timed(writer: VideoWriter, stats: RoleStats) -> None:
    """Flush the encoder: application work, like every encode."""
    cpu = time.thread_time()
    writer.close()
    stats.compute_s += time.thread_time() - cpu


def _writer(config: RunConfig, cleanup: ExitStack) -> VideoWriter:
    """The output video's encoder; into a scratch file when the run keeps no output."""
    output = config.output
    if output is None:
        scratch = cleanup.enter_context(tempfile.TemporaryDirectory(prefix="ar-output-"))
        output = str(Path(scratch) / "out.mp4")
    return VideoWriter(output, config.width, config.height, probe(config.video).fps)


def _set_up(role: str, index: int, config: RunConfig, cleanup: ExitStack) -> _Run:
    """Everything a role needs before ``go``: its end of the pipeline, model, encoder."""
    if role == "floor":
        detector, writer = PeopleDetector(config.detect_width), _writer(config, cleanup)

        def whole(stats: RoleStats) -> None:
            floor(config, detector, writer, stats)
            _close_timed(writer, stats)

        return _Run(whole)
    if role == "pool":
        detector = PeopleDetector(config.detect_width)
        frames = pool_share(config, index, config.detectors)
        return _Run(lambda stats: pool_detect(frames, detector, stats))
    links = backend(config.backend)
    if role == "extractor":
        probe(config.video)  # a bad video fails here, before the others wait for frames
        extractor = links.open_extractor(config)

        def extract_all(stats: RoleStats) -> None:
            extract(extractor, config, stats)
            with LinkMeter(stats):
                extractor.close()

        return _Run(extract_all, extractor.address, extractor.connect)
    if role == "detector":
        model = PeopleDetector(config.detect_width)
        detector_end = links.open_detector(config, index)

        def detect_all(stats: RoleStats) -> None:
            detect(detector_end, model, stats)
            with LinkMeter(stats):
                detector_end.close()

        return _Run(detect_all, detector_end.address, detector_end.connect)
    if role == "combinator":
        writer = _writer(config, cleanup)
        combinator = links.open_combinator(config)

        def combine_all(stats: RoleStats) -> None:
            combine(combinator, config, writer, stats)
            _close_timed(writer, stats)
            with LinkMeter(stats):
                combinator.close()

        return _Run(combine_all, combinator.address, combinator.connect)
    raise ValueError(f"unknown role {role!r}; one of {ROLES}")
