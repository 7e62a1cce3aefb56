"""Render synthetic, photo-like landscape images from a seed.

These are *not* photographs: every pixel comes from ``numpy`` random numbers. What makes them
compress like photos (about 0.3 bytes/pixel as JPEG at quality 85) rather than like flat
test cards is the structure:

* a sky gradient above a ground colour, split by a jagged horizon (a 1-D fractal ridge);
* sharp-edged rectangles and ellipses on the ground (edges cost bits, as in real scenes);
* multi-scale value noise - octaves from 256 px cells down to single pixels, built as a
  pyramid - as lighting and texture, weaker in the sky than on the ground;
* a per-pixel grain, like sensor noise.

Features are sized in pixels, not in fractions of the image, so bytes per pixel stay nearly
constant across image sizes and a file-size target maps onto a pixel count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt
from PIL import Image, ImageDraw

__all__ = ["SCENES", "Scene", "render_scene"]

RGB = tuple[int, int, int]
F32 = npt.NDArray[np.float32]
_EXPONENT: Final = 0.3


@dataclass(frozen=True)
class Scene:
    """Colours and structure of one kind of synthetic landscape."""

    sky_top: RGB
    sky_bottom: RGB
    ground: RGB
    horizon: float  # mean horizon height as a fraction of the image height, from the top
    texture: float = 45.0  # std of the multi-scale noise on the ground (grey levels)
    grain: float = 9.0  # standard deviation of the per-pixel grain (grey levels)
    shapes: int = 14  # sharp-edged objects on the ground


SCENES: Final[dict[str, Scene]] = {
    # Half sky, half fields: the generic image for the size targets.
    "landscape": Scene((80, 130, 210), (175, 205, 235), (70, 120, 50), horizon=0.45),
    # Mostly sky over a thin strip of ground.
    "blue_sky": Scene((60, 110, 200), (140, 185, 235), (80, 105, 70), horizon=0.88, texture=34),
    # Ground filling nearly the frame.
    "green_field": Scene((150, 185, 220), (190, 210, 225), (60, 130, 40), horizon=0.08),
    # A moonless night.
    "night": Scene((10, 12, 30), (25, 25, 45), (15, 18, 15), horizon=0.6, texture=14, grain=5),
    # Orange sky over brown earth.
    "sunset": Scene((200, 110, 60), (245, 170, 90), (95, 60, 40), horizon=0.6),
}


def _fractal(
    rng: np.random.Generator, width: int, height: int, coarsest: int, finest: int = 1
) -> F32:
    """Noise octaves from ``coarsest``- down to ``finest``-pixel cells, unit standard deviation.

    Built coarse to fine, each level upsampled (bicubic) and added to fresh noise, so the cost
    is about that of one full-size resize. Amplitude grows as cell**EXPONENT: a flatter
    spectrum than natural images' 1/f, so that JPEG also sees texture at small scales.
    """
    cur: F32 | None = None
    variance = 0.0
    cell = coarsest
    while cell >= finest:
        gw, gh = max(2, -(-width // cell)), max(2, -(-height // cell))
        amp = cell**_EXPONENT
        variance += amp * amp
        noise = rng.standard_normal((gh, gw), dtype=np.float32) * np.float32(amp)
        if cur is None:
            cur = noise
        else:
            up = Image.fromarray(cur, "F").resize((gw, gh), Image.Resampling.BICUBIC)
            cur = np.asarray(up, dtype=np.float32) + noise
        cell //= 2
    assert cur is not None
    full = Image.fromarray(cur, "F").resize((width, height), Image.Resampling.BICUBIC)
    return np.asarray(full, dtype=np.float32) / np.float32(math.sqrt(variance))


def render_scene(width: int, height: int, scene: Scene, seed: int) -> Image.Image:
    """An RGB image of ``scene``; the same arguments always give the same pixels."""
    if width < 8 or height < 8:
        raise ValueError(f"sample images must be at least 8x8, got {width}x{height}")
    rng = np.random.default_rng(seed)

    ridge_noise = _fractal(rng, width, 1, min(512, width), finest=4)[0]
    ridge = (scene.horizon + 0.05 * ridge_noise) * height
    rows = np.arange(height, dtype=np.float32)[:, None]
    ground_mask = rows > ridge[None, :]
    t = (rows / np.float32(height))[..., None]
    sky = np.array(scene.sky_top, np.float32) * (1 - t) + np.array(scene.sky_bottom, np.float32) * t
    base = np.where(ground_mask[..., None], np.array(scene.ground, np.float32), sky)

    img = Image.fromarray(base.astype(np.uint8), "RGB")
    draw = ImageDraw.Draw(img)
    top = int(height * scene.horizon)
    for _ in range(scene.shapes):
        x0, y0 = int(rng.integers(0, width)), int(rng.integers(top, height))
        size = int(rng.integers(max(4, width // 40), max(8, width // 8)))
        shade = np.array(scene.ground) * rng.uniform(0.5, 1.4, 3)
        fill = tuple(int(v) for v in shade.clip(0, 255))
        box = (x0, y0, x0 + size, y0 + size * 2 // 3)
        if rng.random() < 0.5:
            draw.rectangle(box, fill=fill)
        else:
            draw.ellipse(box, fill=fill)

    pixels = np.asarray(img, dtype=np.float32).copy()
    light = _fractal(rng, width, height, 256)
    amp = np.where(ground_mask, np.float32(scene.texture), np.float32(scene.texture * 0.35))
    pixels += (amp * light)[..., None]
    pixels += np.float32(scene.grain) * rng.standard_normal((height, width, 1), dtype=np.float32)
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGB")
