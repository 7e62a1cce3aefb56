"""The application's optional parts (PyAV for video, OpenCV for the detector), checked once
before a command starts processes that would each fail to import them."""

from __future__ import annotations

from importlib.util import find_spec

from apps.ar.errors import PartsMissing

__all__ = ["require_parts"]

_PARTS = {"av": "PyAV", "cv2": "OpenCV"}


def require_parts() -> None:
    """``PartsMissing`` naming what to install when PyAV or OpenCV cannot be imported."""
    missing = [name for module, name in _PARTS.items() if find_spec(module) is None]
    if missing:
        raise PartsMissing(
            f"the AR application needs {' and '.join(missing)}: pip install 'cdiflow[ar]'"
        )
