"""Dashboards for cdiflow. ``web/`` is the browser dashboard the controller serves at ``/``:
plain HTML, CSS and JavaScript modules, no build step (see ``dashboards/README.md``)."""

from __future__ import annotations

from pathlib import Path
from typing import Final

__all__ = ["WEB_ROOT"]

# Package data (pyproject ships *.html, *.js, *.css), so it sits beside this file installed too.
WEB_ROOT: Final = Path(__file__).resolve().parent / "web"
