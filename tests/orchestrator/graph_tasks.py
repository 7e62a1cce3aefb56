"""Tasks of the graph end-to-end tests, with named inputs and outputs of every kind (workers
import this module: the tests deploy the ``tests`` package with ``CDIFLOW_TASK_PACKAGES``).

Each also runs in the test process itself, so a result can be checked against the same
functions called in one process."""

from __future__ import annotations

import hashlib
import time
from typing import Any

import numpy as np
import numpy.typing as npt
from PIL import Image, ImageFilter

from workflows.api import TaskContext, TaskResult, task


def _nap(ctx: TaskContext) -> None:
    time.sleep(float(ctx.params.get("ms", 0)) / 1000)


@task(name="nap_blur")
def nap_blur(image: Image.Image, ctx: TaskContext) -> Image.Image:
    """Naps ``params.ms``, then blurs: a branch that makes an image."""
    _nap(ctx)
    return image.filter(ImageFilter.GaussianBlur(2))


@task(name="measure")
def measure(image: Image.Image, ctx: TaskContext) -> dict[str, Any]:
    """Naps ``params.ms``, then measures: a branch that makes a NumPy array (the per-channel
    histogram), bytes (the first row's pixels) and JSON (the size)."""
    _nap(ctx)
    pixels = np.asarray(image.convert("RGB"))
    hist = np.stack([np.bincount(pixels[..., c].ravel(), minlength=256) for c in range(3)])
    return {
        "hist": hist.astype(np.int64),
        "row": pixels[0].tobytes(),
        "size": [image.width, image.height],
    }


@task(name="combine")
def combine(
    blurred: Image.Image,
    hist: npt.NDArray[np.int64],
    row: memoryview,
    size: list[int],
    ctx: TaskContext,
) -> TaskResult:
    """A join of both branches: every input, of four kinds, in its output."""
    return TaskResult(
        image=blurred.convert("L"),
        output={
            "blurred_size": [blurred.width, blurred.height],
            "hist_total": int(hist.sum()),
            "hist_sha": hashlib.sha256(np.ascontiguousarray(hist).tobytes()).hexdigest(),
            "row_sha": hashlib.sha256(bytes(row)).hexdigest(),
            "size": list(size),
        },
    )


@task(name="fail_branch")
def fail_branch(image: Image.Image, ctx: TaskContext) -> None:
    """Naps ``params.ms``, then fails: a branch that never succeeds."""
    _nap(ctx)
    raise RuntimeError("this branch always fails")


@task(name="ramp", needs_image=False)
def ramp(ctx: TaskContext) -> dict[str, Any]:
    """A NumPy array of ``input.data.n`` floats, 0 to n - 1."""
    return {"values": np.arange(int(ctx.input["n"]), dtype=np.float64)}


@task(name="scale", needs_image=False)
def scale(values: npt.NDArray[np.float64], ctx: TaskContext) -> dict[str, Any]:
    """The array times ``params.by``, and its sum."""
    scaled = values * float(ctx.params.get("by", 1))
    return {"values": scaled, "total": float(scaled.sum())}


def _boxes(n: int, width: int, height: int) -> list[tuple[int, int, int, int]]:
    """An n x n grid over the image, row by row."""
    return [(c * width // n, r * height // n, (c + 1) * width // n, (r + 1) * height // n)
            for r in range(n) for c in range(n)]  # fmt: skip


@task(name="tiles")
def tiles(image: Image.Image, ctx: TaskContext) -> dict[str, Any]:
    """The image cut into ``params.n`` x ``params.n`` tiles (a list output), and the grid."""
    n = int(ctx.params.get("n", 4))
    cut = [image.crop(box) for box in _boxes(n, image.width, image.height)]
    return {"tiles": cut, "grid": [n, image.width, image.height]}


@task(name="blur_tile")
def blur_tile(tile: Image.Image, ctx: TaskContext) -> dict[str, Any]:
    """One tile, blurred (run once per tile)."""
    return {"tile": tile.filter(ImageFilter.GaussianBlur(2))}


@task(name="stitch")
def stitch(tiles: list[Image.Image], grid: list[int], ctx: TaskContext) -> Image.Image:
    """The tiles put back in their places, in order."""
    n, width, height = grid
    canvas = Image.new(tiles[0].mode, (width, height))
    for tile, box in zip(tiles, _boxes(n, width, height), strict=True):
        canvas.paste(tile, box[:2])
    return canvas
