"""The AR application's image parts: video in and out, the frame message, the detector on the
generated sample video."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from workflows.ar import framebuf
from workflows.ar.detector import Box, PeopleDetector, draw_boxes
from workflows.ar.sample import SampleVideo, make_sample_video
from workflows.ar.video import VideoWriter, probe, read_frames
from workflows.errors import InvalidVideo

SAMPLE = SampleVideo(frames=10)


@pytest.fixture(scope="module")
def sample_video(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_sample_video(tmp_path_factory.mktemp("ar") / "sample.mp4", SAMPLE)


def _found(truth: tuple[int, int, int, int], box: Box) -> bool:
    """The figure's centre lies in the box, and the box is about a person's height."""
    x, y, w, h = truth
    cx, cy = x + w / 2, y + h / 2
    inside = box.x <= cx <= box.x + box.w and box.y <= cy <= box.y + box.h
    return inside and 0.7 <= box.h / h <= 1.6


def test_the_detector_finds_the_sample_videos_people(sample_video: Path) -> None:
    detector = PeopleDetector()
    found = missed = false = 0
    for index, frame in enumerate(read_frames(sample_video)):
        boxes = detector.detect(frame)
        truth = SAMPLE.truth(index)
        found += sum(any(_found(t, b) for b in boxes) for t in truth)
        missed += sum(not any(_found(t, b) for b in boxes) for t in truth)
        false += sum(not any(_found(t, b) for t in truth) for b in boxes)
    assert found + missed == 4 * SAMPLE.frames
    assert found >= 0.75 * (found + missed), f"found {found}, missed {missed}"
    assert false <= SAMPLE.frames // 5, f"{false} boxes where nobody is"


def test_the_sample_video_decodes_to_what_was_drawn(sample_video: Path) -> None:
    info = probe(sample_video)
    assert (info.width, info.height, info.frames) == (1280, 720, SAMPLE.frames)
    frames = list(read_frames(sample_video))
    assert len(frames) == SAMPLE.frames
    drawn = SAMPLE.render(3).astype(np.int16)
    # A lossy codec: close, not equal (crf 18).
    assert np.abs(frames[3].astype(np.int16) - drawn).mean() < 3


def test_boxes_are_drawn_with_their_label() -> None:
    frame = np.zeros((200, 300, 3), np.uint8)
    draw_boxes(frame, [Box(50, 60, 80, 120, 1.5)])
    assert (frame[100, 50] == (0, 0, 255)).all()  # the left edge, red
    assert frame[:60, 50:130].any()  # the label above the box
    assert not frame[190:, 200:].any()


def test_a_frame_message_carries_frame_header_and_boxes() -> None:
    frame = np.random.default_rng(1).integers(0, 256, (36, 64, 3), dtype=np.uint8)
    buf = bytearray(framebuf.message_size(64, 36))
    framebuf.write_frame(buf, 7, 123, frame)
    boxes = [Box(1, 2, 3, 4, 0.5), Box(5, 6, 7, 8, 1.25)]
    framebuf.write_boxes(buf, boxes)
    header = framebuf.read_header(buf)
    assert (header.seq, header.t0_ns, header.width, header.height, header.end) == (
        7, 123, 64, 36, False,
    )  # fmt: skip
    assert framebuf.read_boxes(buf, header) == boxes
    assert (framebuf.pixels(buf, 36, 64) == frame).all()
    framebuf.write_end(buf, 9)
    assert framebuf.read_header(buf).end and framebuf.read_header(buf).seq == 9


def test_a_bad_frame_message_is_refused() -> None:
    with pytest.raises(InvalidVideo, match="not a frame message"):
        framebuf.read_header(bytes(framebuf.PIXELS_OFFSET))
    with pytest.raises(InvalidVideo, match="at least"):
        framebuf.read_header(b"short")
    buf = bytearray(framebuf.message_size(64, 36))
    framebuf.write_frame(buf, 0, 0, np.zeros((36, 64, 3), np.uint8))
    with pytest.raises(InvalidVideo, match="does not fit"):
        framebuf.read_header(buf[:-1])


def test_what_is_not_a_video_is_refused_with_the_reason(tmp_path: Path) -> None:
    with pytest.raises(InvalidVideo, match="no video file"):
        probe(tmp_path / "missing.mp4")
    junk = tmp_path / "junk.mp4"
    junk.write_bytes(b"not a video at all" * 100)
    with pytest.raises(InvalidVideo, match="not a video"):
        list(read_frames(junk))
    with pytest.raises(InvalidVideo, match="even sides"):
        VideoWriter(tmp_path / "odd.mp4", 65, 36)
    with VideoWriter(tmp_path / "ok.mp4", 64, 36) as writer, pytest.raises(InvalidVideo):
        writer.write(np.zeros((36, 66, 3), np.uint8))
