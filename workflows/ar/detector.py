"""The object detector of the AR application: OpenCV's HOG people detector, and labelled boxes.

The model ships inside OpenCV (``HOGDescriptor.getDefaultPeopleDetector``, a linear SVM over
HOG features trained on pedestrians), so nothing is downloaded at run time. Detection runs on a
copy scaled down to ``detect_width`` pixels across, as detectors do (YOLO resizes to 640 too):
HOG's cost grows with the pixel count, and people a third of the frame tall need no more.
Boxes come back in the frame's own pixels.

OpenCV runs single-threaded (``workflows.ar.threads``); the result is the same in every
process.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import cv2
import numpy as np
import numpy.typing as npt

from workflows.ar.boxes import Box
from workflows.ar.threads import opencv_single_threaded

__all__ = ["Box", "PeopleDetector", "draw_boxes"]

Frame = npt.NDArray[np.uint8]
_BOX_COLOUR = (0, 0, 255)  # BGR red
_TEXT_COLOUR = (255, 255, 255)


class PeopleDetector:
    """Finds people in BGR frames; one per process (the descriptor is not shared)."""

    def __init__(self, detect_width: int = 640) -> None:
        if detect_width < 64:
            raise ValueError(f"detect_width must be at least 64 (HOG's window), got {detect_width}")
        opencv_single_threaded()
        self.detect_width = detect_width
        self._hog = cv2.HOGDescriptor()
        self._hog.setSVMDetector(np.asarray(cv2.HOGDescriptor.getDefaultPeopleDetector()))

    def detect(self, frame: Frame) -> list[Box]:
        """People in ``frame`` (H x W x 3, BGR), sorted by position; reads ``frame`` only."""
        height, width = frame.shape[:2]
        scale = min(1.0, self.detect_width / width)
        small: npt.NDArray[Any] = frame
        if scale < 1.0:
            size = (self.detect_width, max(1, round(height * scale)))
            small = cv2.resize(frame, size, interpolation=cv2.INTER_AREA)
        rects, weights = self._hog.detectMultiScale(
            small, winStride=(8, 8), padding=(8, 8), scale=1.05
        )
        boxes = [
            Box(
                round(x / scale),
                round(y / scale),
                round(w / scale),
                round(h / scale),
                float(np.float32(score)),  # as stored in a frame's header
            )
            for (x, y, w, h), score in zip(rects, np.ravel(weights), strict=True)
        ]
        return sorted(boxes)


def draw_boxes(frame: Frame, boxes: Sequence[Box]) -> None:
    """Draw each box with its label above it, in place."""
    thickness = max(2, frame.shape[1] // 400)
    font_scale = frame.shape[1] / 1600
    for box in boxes:
        cv2.rectangle(frame, (box.x, box.y), (box.x + box.w, box.y + box.h), _BOX_COLOUR, thickness)
        (text_w, text_h), base = cv2.getTextSize(box.label, cv2.FONT_HERSHEY_SIMPLEX, font_scale, 1)
        top = max(0, box.y - text_h - base - 2)
        cv2.rectangle(
            frame, (box.x, top), (box.x + text_w + 4, top + text_h + base + 2), _BOX_COLOUR, -1
        )
        cv2.putText(
            frame,
            box.label,
            (box.x + 2, top + text_h + 1),
            cv2.FONT_HERSHEY_SIMPLEX,
            font_scale,
            _TEXT_COLOUR,
            1,
            cv2.LINE_AA,
        )
