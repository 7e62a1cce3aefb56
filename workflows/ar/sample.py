"""The sample video of the AR application: people-like figures walking over a landscape.

Rendered from a seed, never downloaded or committed: a still landscape from
``workflows.samples`` (sky, horizon, textured ground) with figures walking across it at
different distances (sizes) and speeds, encoded as H.264. The same arguments give the same
pixels. ``truth`` says where each figure is in every frame, so a test can check that the
detector finds them.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np

from workflows.ar.figures import Walker, draw_walker
from workflows.ar.video import Frame, VideoWriter
from workflows.samples.generate import SCENES, render_scene

__all__ = ["DEFAULT_SIZE", "SampleVideo", "make_sample_video"]

DEFAULT_SIZE = (1280, 720)  # 2.76 MB a BGR frame, like the paper's ~2 MB frames


def _walkers(width: int, height: int) -> list[Walker]:
    """Four figures between a third and a half of the frame tall, each walking to and fro in
    a lane of its own (they never overlap, and stay in view however long the video); dark
    clothes on light ground, like the people the detector was trained on."""
    w, h = width / 1280, height / 720
    specs = [  # left end, reach, feet, height, speed (1280x720 pixels), clothes, skin (BGR)
        (110, 150, 660, 330, 3.0, (45, 35, 90), (120, 150, 200)),
        (420, 150, 600, 260, 2.5, (90, 45, 40), (100, 140, 190)),
        (730, 150, 650, 320, 3.5, (40, 40, 45), (110, 150, 210)),
        (1040, 130, 580, 240, 2.0, (70, 60, 110), (90, 130, 180)),
    ]
    return [
        Walker(x * w, reach * w, round(feet * h), round(tall * h), speed * w, clothes, skin)
        for x, reach, feet, tall, speed, clothes, skin in specs
    ]


@dataclass(frozen=True)
class SampleVideo:
    """How the sample video is made; ``render`` draws one frame of it."""

    width: int = DEFAULT_SIZE[0]
    height: int = DEFAULT_SIZE[1]
    frames: int = 75
    fps: int = 25
    seed: int = 11

    def walkers(self) -> list[Walker]:
        return _walkers(self.width, self.height)

    def background(self) -> Frame:
        scene = render_scene(self.width, self.height, SCENES["landscape"], self.seed)
        return np.ascontiguousarray(np.asarray(scene)[:, :, ::-1])  # RGB -> BGR

    def render(self, index: int, background: Frame | None = None) -> Frame:
        frame = (self.background() if background is None else background).copy()
        for walker in self.walkers():
            draw_walker(frame, walker, index)
        return frame

    def truth(self, index: int) -> list[tuple[int, int, int, int]]:
        """Each figure's box (x, y, w, h) in frame ``index``, head to feet."""
        boxes = []
        for walker in self.walkers():
            half = walker.height * 0.2
            x = round(walker.centre(index) - half)
            boxes.append((x, walker.foot_y - walker.height, round(2 * half), walker.height))
        return boxes


def make_sample_video(path: str | Path, sample: SampleVideo | None = None) -> Path:
    """Write the sample video to ``path`` (any container FFmpeg knows by its suffix)."""
    sample = sample or SampleVideo()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    background = sample.background()
    # A high-quality encode: the detectors see what was drawn, not the codec's blocks.
    options = {"preset": "veryfast", "crf": "18"}
    with VideoWriter(out, sample.width, sample.height, Fraction(sample.fps), options=options) as w:
        for index in range(sample.frames):
            w.write(sample.render(index, background))
    return out
