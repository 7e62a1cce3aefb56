"""A user task module the end-to-end and worker tests register by module path (workers import
it: the tests deploy the ``tests`` package with ``CDIFLOW_TASK_PACKAGES``)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from PIL import Image

from workflows.api import TaskContext, TaskResult, task


@task(name="fail_first_attempt")
def fail_first_attempt(img: Image.Image, ctx: TaskContext) -> None:
    """Fails on attempt 1, succeeds (image unchanged) from attempt 2 on."""
    if ctx.attempt == 1:
        raise RuntimeError("a transient failure on the first attempt")


@task(name="echo_input", timeout_s=10, needs_image=False)
def echo_input(img: Image.Image | None, ctx: TaskContext) -> TaskResult:
    """A dataless task: returns the workflow's input.data and whether it got pixels."""
    return TaskResult(output={"echo": dict(ctx.input), "had_image": img is not None})


@task(name="scribble_then_fail")
def scribble_then_fail(img: Image.Image, ctx: TaskContext) -> None:
    """Changes its input in place, then fails: the retry must still get the input unchanged."""
    img.paste((255, 0, 255), (0, 0, img.width, img.height))
    raise RuntimeError("failed after scribbling on its input")


def not_a_task(img: Image.Image | None, ctx: TaskContext) -> None:
    """A function of a deployed module without ``@task``: it must never run as a task."""
    raise AssertionError("an undecorated function ran as a task")


shell = os.system  # a callable this module happens to hold


@task(name="stubborn_sleep", timeout_s=60, needs_image=False)
def stubborn_sleep(img: Image.Image | None, ctx: TaskContext) -> None:
    """Sleeps ``params["ms"]`` in a call nothing in the process can interrupt, and never looks
    at ``ctx.cancelled``: only ending its process stops it."""
    time.sleep(float(ctx.params.get("ms", 0)) / 1000.0)


@task(name="wait_for_cancel", timeout_s=60, needs_image=False)
def wait_for_cancel(img: Image.Image | None, ctx: TaskContext) -> None:
    """Waits ``params["ms"]`` for a stop; stopped, its ``on_cancel`` callback writes
    "cancelled" into the file ``params["marker"]`` (what a task cleaning up would do)."""
    marker = ctx.params.get("marker")
    if isinstance(marker, str):
        ctx.on_cancel(lambda: Path(marker).write_text("cancelled"))
    ctx.cancelled.wait(float(ctx.params.get("ms", 0)) / 1000.0)
