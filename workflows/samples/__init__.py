"""Sample images for demos, tests and benchmarks - all synthetic (see ``generate``).

Two sets:

* ``make_sample_images(dir)`` writes JPEGs of about 10 KB, 100 KB, 500 KB and 2 MB
  (``SIZE_TARGETS``), rendered from a seed; they are generated on demand, never committed.
* The small files committed next to this module (``bundled_samples()``), one per
  ``classify`` label in ``BUNDLED_LABELS``, for the demo. They were written by
  ``python -m workflows.samples --bundled`` and are not photographs either.
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Final

from PIL import Image

from workflows.samples.generate import SCENES, Scene, render_scene

__all__ = [
    "BUNDLED_LABELS",
    "SAMPLES_DIR",
    "SIZE_TARGETS",
    "Scene",
    "bundled_samples",
    "make_bundled_samples",
    "make_sample_images",
    "render_scene",
]

SAMPLES_DIR: Final = Path(__file__).resolve().parent

# File-size targets in bytes, by name; files are written as ``sample_<name>.jpg``.
SIZE_TARGETS: Final[dict[str, int]] = {
    "10k": 10_000,
    "100k": 100_000,
    "500k": 500_000,
    "2m": 2_000_000,
}

# Committed sample -> the label ``classify`` gives it (asserted by the tests).
BUNDLED_LABELS: Final[dict[str, str]] = {
    "blue_sky.jpg": "blue",
    "green_field.jpg": "green",
    "night.jpg": "dark",
    "sunset.jpg": "warm",
}
_BUNDLED_SIZE: Final = (400, 300)  # ~40 KB each, under the 60 KB budget for committed files

_BYTES_PER_PIXEL: Final = 0.305  # measured for the "landscape" scene at quality 85
_ASPECT: Final = 1.5


def _jpeg(img: Image.Image, quality: int) -> bytes:
    out = io.BytesIO()
    img.save(out, format="JPEG", quality=quality)
    return out.getvalue()


def _dims(pixels: float) -> tuple[int, int]:
    height = max(8, round(math.sqrt(pixels / _ASPECT)))
    return max(8, round(height * _ASPECT)), height


def _render_to_size(target: int, seed: int, quality: int) -> bytes:
    """JPEG bytes near ``target``: render at the estimated size, correct once if > 10% off."""
    width, height = _dims(target / _BYTES_PER_PIXEL)
    data = _jpeg(render_scene(width, height, SCENES["landscape"], seed), quality)
    if abs(len(data) / target - 1) > 0.10:  # another encoder build, or a different quality
        width, height = _dims(width * height * target / len(data))
        data = _jpeg(render_scene(width, height, SCENES["landscape"], seed), quality)
    return data


def make_sample_images(
    directory: str | Path,
    seed: int = 20240601,
    sizes: Iterable[str] | None = None,
    quality: int = 85,
) -> dict[str, Path]:
    """Write ``sample_<size>.jpg`` for each name in ``sizes`` (default: all ``SIZE_TARGETS``).

    Synthetic landscapes, reproducible: the same seed gives the same pixels (and, with the
    same libjpeg, the same bytes). Returns the written paths by size name.
    """
    out_dir = Path(directory)
    out_dir.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    for name in SIZE_TARGETS if sizes is None else sizes:
        if name not in SIZE_TARGETS:
            raise ValueError(f"unknown sample size {name!r}; choose from {sorted(SIZE_TARGETS)}")
        path = out_dir / f"sample_{name}.jpg"
        path.write_bytes(_render_to_size(SIZE_TARGETS[name], seed, quality))
        written[name] = path
    return written


def make_bundled_samples(directory: str | Path, seed: int = 7) -> dict[str, Path]:
    """Write the small demo images of ``BUNDLED_LABELS`` into ``directory``."""
    out_dir = Path(directory)
    out_dir.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    for i, filename in enumerate(BUNDLED_LABELS):
        scene = SCENES[filename.removesuffix(".jpg")]
        img = render_scene(*_BUNDLED_SIZE, scene, seed + i)
        path = out_dir / filename
        path.write_bytes(_jpeg(img, 85))
        written[filename] = path
    return written


def bundled_samples() -> dict[str, Path]:
    """Paths of the committed demo images, by file name."""
    return {name: SAMPLES_DIR / name for name in BUNDLED_LABELS}
