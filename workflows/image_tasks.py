"""The bundled image tasks: ``deblur``, ``denoise``, ``classify``, ``blend`` (a join of two
images), and ``noop``/``sleep``.

Each is a thin wrapper over one Pillow operation, so tests can compare it pixel for pixel with
the same operation applied directly.
"""

from __future__ import annotations

import math
from typing import Any, Final

from PIL import Image, ImageFilter, ImageStat

from workflows.api import TaskContext, TaskResult, run_task_on_image, task
from workflows.imagebuf import normalize_mode

__all__ = [
    "CLASSIFY_THRESHOLDS",
    "LABELS",
    "blend",
    "classify",
    "classify_stats",
    "deblur",
    "denoise",
    "hand_back",
    "noop",
    "reference_pipeline",
    "sleep",
]

DEBLUR_FILTER: Final = ImageFilter.UnsharpMask(radius=2, percent=150, threshold=3)
DENOISE_FILTER: Final = ImageFilter.GaussianBlur(radius=1)


@task(name="deblur", timeout_s=30, retries=2)
def deblur(img: Image.Image, ctx: TaskContext) -> TaskResult:
    """Sharpen: ``ImageFilter.UnsharpMask(radius=2, percent=150, threshold=3)``."""
    return TaskResult(image=img.filter(DEBLUR_FILTER))


@task(name="denoise", timeout_s=30, retries=2)
def denoise(img: Image.Image, ctx: TaskContext) -> TaskResult:
    """Smooth: ``ImageFilter.GaussianBlur(radius=1)``."""
    return TaskResult(image=img.filter(DENOISE_FILTER))


# --- classify ------------------------------------------------------------------------------

LABELS: Final = ("dark", "bright", "grey", "blue", "green", "warm", "mixed")
CLASSIFY_THRESHOLDS: Final[dict[str, float]] = {
    "dark_below": 60.0,  # brightness < 60
    "bright_above": 200.0,  # brightness > 200
    "grey_spread_below": 12.0,  # max(mean_rgb) - min(mean_rgb) < 12
    "blue_margin": 12.0,  # B - max(R, G) >= 12
    "green_margin": 8.0,  # G - max(R, B) >= 8
    "warm_margin": 20.0,  # R - B >= 20 and R is the largest mean
}


def classify_stats(mean_rgb: tuple[float, float, float]) -> tuple[str, float]:
    """``(label, brightness)`` from the per-channel means; see ``classify`` for the rule."""
    r, g, b = mean_rgb
    t = CLASSIFY_THRESHOLDS
    brightness = 0.299 * r + 0.587 * g + 0.114 * b
    if brightness < t["dark_below"]:
        return "dark", brightness
    if brightness > t["bright_above"]:
        return "bright", brightness
    if max(mean_rgb) - min(mean_rgb) < t["grey_spread_below"]:
        return "grey", brightness
    if b - max(r, g) >= t["blue_margin"]:
        return "blue", brightness
    if g - max(r, b) >= t["green_margin"]:
        return "green", brightness
    if r >= max(g, b) and r - b >= t["warm_margin"]:
        return "warm", brightness
    return "mixed", brightness


@task(name="classify", timeout_s=30, retries=2)
def classify(img: Image.Image, ctx: TaskContext) -> TaskResult:
    """Label the image from its mean colour. A fixed hand-written rule, *not* a trained model.

    ``mean_rgb`` is the per-channel mean (``ImageStat.Stat(img).mean``; greyscale counts as
    R = G = B; alpha is ignored, transparent pixels included). ``brightness`` is the Rec. 601
    luma of that mean: ``0.299 R + 0.587 G + 0.114 B``. The first matching rule wins:

    ========  =================================================
    label     condition (``R, G, B`` = ``mean_rgb``)
    ========  =================================================
    dark      brightness < 60
    bright    brightness > 200
    grey      max(R, G, B) - min(R, G, B) < 12  (no colour cast)
    blue      B - max(R, G) >= 12               (e.g. sky, water)
    green     G - max(R, B) >= 8                (e.g. foliage)
    warm      R is the largest and R - B >= 20  (e.g. sunset, skin, sand)
    mixed     anything else
    ========  =================================================

    A mean says nothing about *where* colours are, so a half-sky, half-forest photo can come
    out ``mixed``. Returns the image unchanged and ``output = {"label": str,
    "brightness": float, "mean_rgb": [R, G, B]}`` (floats rounded to 2 decimals).
    """
    if img.mode == "L":
        mean = float(ImageStat.Stat(img).mean[0])
        rgb = (mean, mean, mean)
    else:
        m = ImageStat.Stat(img).mean  # RGB or RGBA; the alpha mean is ignored
        rgb = (float(m[0]), float(m[1]), float(m[2]))
    label, brightness = classify_stats(rgb)
    output: dict[str, Any] = {
        "label": label,
        "brightness": round(brightness, 2),
        "mean_rgb": [round(c, 2) for c in rgb],
    }
    return TaskResult(image=None, output=output)


@task(name="blend", timeout_s=30, retries=2)
def blend(sharp: Image.Image, smooth: Image.Image, ctx: TaskContext) -> TaskResult:
    """Join two images of one size into their average (``Image.blend``, half each; ``smooth``
    in ``sharp``'s mode): the join of ``fork_join_pipeline``."""
    if smooth.size != sharp.size:
        raise ValueError(f"blend needs two images of one size, got {sharp.size} and {smooth.size}")
    return TaskResult(image=Image.blend(sharp, smooth.convert(sharp.mode), 0.5))


# --- benchmark tasks -----------------------------------------------------------------------


@task(name="noop", timeout_s=10, retries=0, needs_image=False)
def noop(img: Image.Image | None, ctx: TaskContext) -> None:
    """Do nothing: measures what the runner itself costs."""
    return None


@task(name="sleep", timeout_s=60, retries=0, needs_image=False)
def sleep(img: Image.Image | None, ctx: TaskContext) -> None:
    """Sleep for ``params["ms"]`` milliseconds (default 0), touching no pixel: fake work that
    ends as soon as the task is stopped."""
    ms = ctx.params.get("ms", 0)
    if isinstance(ms, bool) or not isinstance(ms, int | float) or not 0 <= ms < math.inf:
        raise ValueError(f"param 'ms' must be a finite number >= 0, got {ms!r}")
    ctx.cancelled.wait(ms / 1000.0)
    return None


@task(name="hand_back", timeout_s=30, retries=0, needs_image=False)
def hand_back(ctx: TaskContext, **data: Any) -> None:
    """Do nothing with whatever it is given. The scheduler sends it to take back what a worker
    still has of a run that ended: the worker then hands the objects back and gives up its
    shares, as after any task."""
    return None


def reference_pipeline(img: Image.Image) -> tuple[Image.Image, str]:
    """deblur -> denoise -> classify in process, with no buffer: the correctness oracle and
    the compute floor for benchmarks. Returns the final image and the label."""
    current = normalize_mode(img)
    output: dict[str, Any] = {}
    for fn in (deblur, denoise, classify):
        ctx = TaskContext(task_name=fn.__name__, workflow_id="reference")
        new, output = run_task_on_image(fn, current, ctx)
        if new is not None:
            current = new
    return current, str(output["label"])
