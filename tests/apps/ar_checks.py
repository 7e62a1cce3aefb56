"""What the AR tests on one host and across hosts share: a run's configuration for a video,
and the check of its output against the single-process reference run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from apps.ar.config import RunConfig
from apps.ar.launch import PipelineResult
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
    assert result.boxes() == reference.boxes()  # the same boxes, frame by frame
    assert sum(len(boxes) for boxes in result.boxes()) >= 2 * frames  # people were found
    assert [r.frames for r in result.of("detector")] == [frames // 2, frames // 2]
    # Decodable, and the same pixels as the reference's output: the detectors drew the same
    # boxes and the encoder is deterministic.
    assert reference.config.output is not None
    produced, expected = list(read_frames(out)), list(read_frames(reference.config.output))
    assert len(produced) == frames
    assert all(np.array_equal(a, b) for a, b in zip(produced, expected, strict=True))
