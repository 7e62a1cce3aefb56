"""Bundled tasks for fan-out (``for_each``): an image cut into tiles, each tile blurred, the
tiles put back (``tiles``, ``blur_tile``, ``stitch``), and dataless no-ops that fan out over
a list of numbers (``spread``, ``pass_item``, ``gather``) or join branches (``merge``), which
measure what a fan-out or a branch costs the orchestrator alone (``cdiflow bench workflows
--quick``).

Each runs as well in one process, so a fan-out's result can be checked against, and timed
beside, the same functions called directly.
"""

from __future__ import annotations

from typing import Any

from PIL import Image, ImageFilter

from workflows.api import TaskContext, task

__all__ = ["blur_tile", "boxes", "gather", "merge", "pass_item", "spread", "stitch", "tiles"]


def boxes(n: int, width: int, height: int) -> list[tuple[int, int, int, int]]:
    """An n x n grid over the image, row by row."""
    return [(c * width // n, r * height // n, (c + 1) * width // n, (r + 1) * height // n)
            for r in range(n) for c in range(n)]  # fmt: skip


@task(name="tiles")
def tiles(image: Image.Image, ctx: TaskContext) -> dict[str, Any]:
    """The image cut into ``params.n`` x ``params.n`` tiles (a list output), and the grid."""
    n = int(ctx.params.get("n", 4))
    cut = [image.crop(box) for box in boxes(n, image.width, image.height)]
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
    for tile, box in zip(tiles, boxes(n, width, height), strict=True):
        canvas.paste(tile, box[:2])
    return canvas


@task(name="spread", timeout_s=10, retries=0, needs_image=False)
def spread(ctx: TaskContext) -> dict[str, Any]:
    """The numbers 0 to ``params.n`` - 1: a small JSON list, carried in the messages."""
    return {"items": list(range(int(ctx.params.get("n", 16))))}


@task(name="pass_item", timeout_s=10, retries=0, needs_image=False)
def pass_item(item: Any, ctx: TaskContext) -> dict[str, Any]:
    """Its element, unchanged (run once per element)."""
    return {"item": item}


@task(name="gather", timeout_s=10, retries=0, needs_image=False)
def gather(items: list[int], ctx: TaskContext) -> dict[str, Any]:
    """How many elements came back, and whether in order."""
    return {"count": len(items), "in_order": items == list(range(len(items)))}


@task(name="merge", timeout_s=10, retries=0, needs_image=False)
def merge(ctx: TaskContext, **parts: Any) -> dict[str, Any]:
    """A join of any number of named inputs: how many it got."""
    return {"count": len(parts)}
