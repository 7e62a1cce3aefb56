"""People-like figures for the sample video: a walking silhouette drawn with OpenCV.

The proportions follow a standing adult (head about an eighth of the height, legs about half)
and the figure is dark against a lighter scene, which is what a HOG people detector trained on
pedestrians responds to: the gradients of a head over shoulders over two legs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import cv2
import numpy as np
import numpy.typing as npt

__all__ = ["Walker", "draw_walker"]

BGR = tuple[int, int, int]
Frame = npt.NDArray[np.uint8]
_UNITS = 180.0  # the figure is drawn in units of a 180-unit-tall person


@dataclass(frozen=True)
class Walker:
    """A figure walking to and fro along its own stretch of the ground line."""

    x0: float
    """Centre at frame 0, in pixels: the left end of its stretch."""
    reach: float
    """Length of its stretch in pixels; it turns at each end."""
    foot_y: int
    """Where the feet touch the ground, in pixels from the top."""
    height: int
    """Height in pixels, head to feet."""
    speed: float
    """Pixels per frame."""
    clothes: BGR
    skin: BGR
    stride: float = 0.35
    """Leg swing, radians of phase per frame."""

    def centre(self, frame: int) -> float:
        if self.reach <= 0:
            return self.x0
        walked = (self.speed * frame) % (2 * self.reach)
        return self.x0 + (walked if walked <= self.reach else 2 * self.reach - walked)


def draw_walker(image: Frame, walker: Walker, frame: int) -> None:
    """Draw ``walker`` as it is at ``frame`` into ``image`` (BGR, in place)."""
    scale = walker.height / _UNITS
    cx = walker.centre(frame)
    top = walker.foot_y - walker.height

    def point(x: float, y: float) -> tuple[int, int]:
        return round(cx + x * scale), round(top + y * scale)

    def width(units: float) -> int:
        return max(2, round(units * scale))

    # Legs apart in an inverted V whose spread breathes with the stride, never crossed nor
    # closed: the pose of the pedestrians the detector was trained on.
    swing = math.sin(walker.stride * frame)
    spread = 21 + 4 * swing
    legs = tuple(max(0, c - 25) for c in walker.clothes)
    cv2.line(image, point(-8, 95), point(-spread, 178), legs, width(11), cv2.LINE_AA)
    cv2.line(image, point(8, 95), point(spread, 178), legs, width(11), cv2.LINE_AA)
    torso = np.array([point(-17, 30), point(17, 30), point(14, 97), point(-14, 97)], np.int32)
    cv2.fillPoly(image, [torso], walker.clothes, cv2.LINE_AA)
    cv2.line(
        image, point(-16, 34), point(-22 - 4 * swing, 92), walker.clothes, width(9), cv2.LINE_AA
    )
    cv2.line(image, point(16, 34), point(22 + 4 * swing, 92), walker.clothes, width(9), cv2.LINE_AA)
    cv2.circle(image, point(0, 14), width(12), walker.skin, -1, cv2.LINE_AA)
