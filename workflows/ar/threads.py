"""OpenCV runs on one thread in the AR application.

The application's parallelism is its processes (N detectors), as in the paper; OpenCV would
otherwise spread each call over every core, so N detectors would compete with N pools of
threads, a detector alone would look N times faster, and CPU spent on OpenCV's threads would
escape the per-thread timers that tell the application's own work from moving frames.
"""

from __future__ import annotations

import cv2

__all__ = ["opencv_single_threaded"]


def opencv_single_threaded() -> None:
    """Make every later OpenCV call in this process run on its calling thread."""
    if cv2.getNumThreads() != 1:
        cv2.setNumThreads(1)
