"""Benchmark inputs: photo-like JPEGs of a target file size, and the n-task pipelines.

The images come from ``workflows.samples.render_scene`` (the same synthetic landscapes as the
bundled samples), sized so the JPEG lands within ~10% of the target, and are cached on disk by
(size, seed) because rendering a 4 MB one takes seconds.
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any, Final

from PIL import Image

from workflows.samples import render_scene
from workflows.samples.generate import SCENES

__all__ = [
    "CHAIN_OPS",
    "SCENARIO2_SIZES",
    "chain_definition",
    "chain_ops",
    "chain_workflow",
    "make_jpeg",
    "sized_images",
]

# Scenario 2 draws from this set: 10 KB to 4 MB (decimal units, as in the paper).
SCENARIO2_SIZES: Final = (10_000, 100_000, 500_000, 1_000_000, 2_000_000, 4_000_000)

# An n-task pipeline cycles through the three image operations: 3 tasks = image_pipeline.
CHAIN_OPS: Final = ("deblur", "denoise", "classify")

_BYTES_PER_PIXEL: Final = 0.305  # the landscape scene at quality 85 (workflows.samples)
_ASPECT: Final = 1.5
_QUALITY: Final = 85


def _jpeg(img: Image.Image) -> bytes:
    out = io.BytesIO()
    img.save(out, format="JPEG", quality=_QUALITY)
    return out.getvalue()


def _render(pixels: float, seed: int) -> bytes:
    height = max(8, round(math.sqrt(pixels / _ASPECT)))
    width = max(8, round(height * _ASPECT))
    return _jpeg(render_scene(width, height, SCENES["landscape"], seed))


def make_jpeg(target: int, seed: int = 20240601) -> bytes:
    """JPEG bytes within ~10% of ``target``: render at the estimated size, correct twice."""
    pixels = target / _BYTES_PER_PIXEL
    data = _render(pixels, seed)
    for _ in range(2):
        if abs(len(data) / target - 1) <= 0.10:
            break
        pixels *= target / len(data)
        data = _render(pixels, seed)
    return data


def sized_images(folder: Path, sizes: list[int], seed: int = 20240601) -> dict[int, Path]:
    """``{target size: path}``, rendering only the ones not cached in ``folder`` yet."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for size in sizes:
        path = folder / f"landscape-{size}-{seed}.jpg"
        if not path.exists():
            tmp = path.with_suffix(".part")
            tmp.write_bytes(make_jpeg(size, seed))
            tmp.replace(path)
        paths[size] = path
    return paths


def chain_ops(tasks: int) -> list[str]:
    """The operations of an n-task pipeline: deblur, denoise, classify, deblur, ..."""
    if tasks < 1:
        raise ValueError(f"a pipeline needs at least one task, not {tasks}")
    return [CHAIN_OPS[i % len(CHAIN_OPS)] for i in range(tasks)]


def chain_workflow(tasks: int) -> str:
    """The cdiflow workflow name of an n-task pipeline (3 tasks: the bundled one)."""
    return "image_pipeline" if tasks == 3 else f"bench_chain_{tasks}"


def chain_definition(tasks: int) -> dict[str, Any]:
    """The workflow definition (REST body) of an n-task pipeline."""
    steps: list[dict[str, Any]] = []
    for i, op in enumerate(chain_ops(tasks)):
        step: dict[str, Any] = {"ref": f"s{i + 1}_{op}", "task": op}
        if steps:
            step["depends_on"] = [steps[-1]["ref"]]
        steps.append(step)
    return {
        "name": chain_workflow(tasks),
        "description": f"{tasks} image tasks in a chain (cdiflow bench workflows)",
        "tasks": steps,
    }
