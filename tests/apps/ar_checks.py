"""What the AR tests on one host and across hosts share: a run's configuration for a video,
the check of its output against the single-process reference run, and a detector killed
mid-run."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from apps.ar.config import RunConfig
from apps.ar.errors import RoleFailed
from apps.ar.launch import PipelineResult, run_pipeline
from workflows.ar.video import probe, read_frames


def config_for(video: Path, **fields: Any) -> RunConfig:
    """A run of ``video`` with two detectors (``fields`` change the rest)."""
    info = probe(video)
    settings: dict[str, Any] = {"backend": "floor", "detectors": 2, "timeout_s": 20, **fields}
    return RunConfig(video=str(video), width=info.width, height=info.height, **settings)


def assert_like_reference(
    result: PipelineResult, reference: PipelineResult, out: Path, frames: int
) -> None:
    """Every frame came out, with the reference run's boxes and pixels, frame by frame."""
    assert result.frames == frames
    assert [r.frames for r in result.of("detector")] == [frames // 2, frames // 2]
    assert_video_like_reference(result.boxes(), out, reference, frames)


def assert_video_like_reference(
    boxes: list[list[list[float]]], out: Path, reference: PipelineResult, frames: int
) -> None:
    """``boxes`` (per frame) are the reference run's, frame by frame, and the video at ``out``
    decodes to the reference's output pixels."""
    assert boxes == reference.boxes()  # the same boxes, frame by frame
    assert sum(len(found) for found in boxes) >= 2 * frames  # people were found
    # Decodable, and the same pixels as the reference's output: the detectors drew the same
    # boxes and the encoder is deterministic.
    assert reference.config.output is not None
    produced, expected = list(read_frames(out)), list(read_frames(reference.config.output))
    assert len(produced) == frames
    assert all(np.array_equal(a, b) for a, b in zip(produced, expected, strict=True))


def kill_a_detector_mid_run(
    config: RunConfig, runtime_pids: Sequence[int], under_way: Callable[[], bool]
) -> RoleFailed:
    """Run ``config`` with two detectors or more, kill detector 1's process (SIGKILL) once
    ``under_way()`` says frames flow, and return how the run failed; no role is left running."""
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            run_pipeline(config, runtime_pids)
        except BaseException as exc:
            outcome.append(exc)

    runner = threading.Thread(target=run)
    runner.start()
    victim = None
    deadline = time.monotonic() + 60
    while victim is None and time.monotonic() < deadline:
        for child in psutil.Process().children():
            if child.cmdline()[-2:] == ["detector", "1"]:
                victim = child
        time.sleep(0.1)
    assert victim is not None, "no detector process appeared"
    while not under_way() and time.monotonic() < deadline:
        time.sleep(0.05)
    victim.kill()
    runner.join(timeout=90)
    assert not runner.is_alive()
    assert outcome and isinstance(outcome[0], RoleFailed), outcome
    assert not [c for c in psutil.Process().children() if "apps.ar.role_process" in c.cmdline()]
    return outcome[0]
