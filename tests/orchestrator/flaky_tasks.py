"""A user task module the end-to-end tests register by module path (workers import it)."""

from __future__ import annotations

from PIL import Image

from workflows.api import TaskContext


def fail_first_attempt(img: Image.Image, ctx: TaskContext) -> None:
    """Fails on attempt 1, succeeds (image unchanged) from attempt 2 on."""
    if ctx.attempt == 1:
        raise RuntimeError("a transient failure on the first attempt")
