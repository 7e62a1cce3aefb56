"""``cdiflow bench images``: what one pass over an image's pixels costs, in this process.

The figures behind two design choices (docs/decisions/2026-12-05-images-on-the-workers.md):
PNG at zlib level 1 rather than Pillow's default 6, JPEG as an optional result format, and
what a task pays to read its image out of a CDI buffer and write a new one in. Each step runs
``repeat`` times on a photo-like image of the given size; the best time is reported (the least
disturbed by other work).
"""

from __future__ import annotations

import io
import mmap
import os
import time
from collections.abc import Callable
from typing import Any

import click
from PIL import Image

from loadtest.images import make_jpeg
from loadtest.pipeline_ops import apply_op
from workflows.imagebuf import (
    JPEG_RESULT_QUALITY,
    RESULT_FORMATS,
    decode_bytes,
    decode_into,
    encode_image,
    map_image,
    normalize_mode,
    open_image,
    read_image,
    required_size,
    write_image,
)

__all__ = ["bench_images_command", "measure_image_costs"]


def _best_ms(step: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        step()
        best = min(best, time.perf_counter() - started)
    return round(best * 1000, 2)


def _encoded(img: Any, **options: Any) -> bytes:
    out = io.BytesIO()
    img.save(out, **options)
    return out.getvalue()


def _write_fresh_mapping(segment: int, size: int, img: Any, populate: bool) -> None:
    """Map a warm shared-memory segment afresh, as a process that creates or receives a CDI
    object does, and write the image into it."""
    flags = mmap.MAP_SHARED | (getattr(mmap, "MAP_POPULATE", 0) if populate else 0)
    mapping = mmap.mmap(segment, size, flags)
    with memoryview(mapping) as view:
        write_image(view, img)
    mapping.close()


def measure_image_costs(size: int, repeat: int) -> dict[str, Any]:
    """Milliseconds per step on one ``size``-byte photo-like JPEG, and the sizes produced."""
    data = make_jpeg(size)
    img = normalize_mode(decode_bytes(data))
    buffer = mmap.mmap(-1, required_size(img.width, img.height, img.mode))
    view = memoryview(buffer)
    write_image(view, img)  # touch the pages once: a warm buffer, as the minion's pool gives
    png_6 = _encoded(img, format="PNG", compress_level=6)
    png_1 = _encoded(img, format="PNG", compress_level=1)
    jpeg = _encoded(img, format="JPEG", quality=JPEG_RESULT_QUALITY)
    raw = encode_image(img, RESULT_FORMATS["raw"].pillow)
    packed = img.tobytes()
    nbytes = required_size(img.width, img.height, img.mode)
    segment = os.memfd_create("image-costs", os.MFD_CLOEXEC)
    os.ftruncate(segment, nbytes)
    os.posix_fallocate(segment, 0, nbytes)  # allocated up front, as the minion's pool does
    steps: dict[str, Callable[[], object]] = {
        "decode jpeg": lambda: decode_bytes(data),
        # The scheduler's input: decoded and copied into the object, or decoded straight in.
        "decode jpeg, then write into cdi buffer": lambda: write_image(view, decode_bytes(data)),
        "decode jpeg straight into cdi buffer": lambda: decode_into(view, open_image(data)),
        "deblur": lambda: apply_op("deblur", img),
        "denoise": lambda: apply_op("denoise", img),
        "classify": lambda: apply_op("classify", img),
        "encode png level 6": lambda: _encoded(img, format="PNG", compress_level=6),
        "encode png level 1": lambda: _encoded(img, format="PNG", compress_level=1),
        f"encode jpeg q{JPEG_RESULT_QUALITY}": lambda: _encoded(
            img, format="JPEG", quality=JPEG_RESULT_QUALITY
        ),
        # The load tests' intermediate formats, written and read back: how images travel
        # between tasks through S3 (``--intermediate``).
        "encode raw (uncompressed tiff)": lambda: encode_image(img, RESULT_FORMATS["raw"].pillow),
        "decode raw": lambda: decode_bytes(raw),
        "decode png level 1": lambda: decode_bytes(png_1),
        "write into cdi buffer": lambda: write_image(view, img),
        "write into a fresh mapping": lambda: _write_fresh_mapping(segment, nbytes, img, False),
        "... mapped with MAP_POPULATE": lambda: _write_fresh_mapping(segment, nbytes, img, True),
        "read from cdi buffer (copy)": lambda: read_image(view),
        "map cdi buffer (a task's input)": lambda: map_image(view),
        # What a 3-bytes-a-pixel layout would cost instead: Pillow keeps RGB in 4.
        "pack to 3-byte rgb (tobytes)": img.tobytes,
        "unpack 3-byte rgb (frombytes)": lambda: Image.frombytes(img.mode, img.size, packed),
    }
    try:
        results = {name: _best_ms(step, repeat) for name, step in steps.items()}
    finally:
        os.close(segment)
    view.release()
    buffer.close()
    return {
        "input_bytes": len(data),
        "width": img.width,
        "height": img.height,
        "repeat": repeat,
        "ms": results,
        "encoded_bytes": {
            "png level 6": len(png_6),
            "png level 1": len(png_1),
            "jpeg": len(jpeg),
            "raw": len(raw),
        },
    }


@click.command("images")
@click.option("--size", default="2MB", show_default=True, help="Input JPEG size, e.g. 500KB.")
@click.option("--repeat", default=3, show_default=True, type=click.IntRange(1, 100))
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def bench_images_command(size: str, repeat: int, as_json: bool) -> None:
    """What one pass over an image costs: decode, the image tasks, encodes, CDI buffer copies."""
    import json

    from loadtest.cli import parse_sizes

    (nbytes,) = parse_sizes(size)
    result = measure_image_costs(nbytes, repeat)
    if as_json:
        click.echo(json.dumps(result))
        return
    megapixels = result["width"] * result["height"] / 1e6
    click.echo(
        f"{result['input_bytes']} byte JPEG, {result['width']}x{result['height']} "
        f"({megapixels:.1f} MP), best of {repeat}"
    )
    for name, ms in result["ms"].items():
        click.echo(f"  {name:<32} {ms:9.1f} ms")
    for name, nbytes in result["encoded_bytes"].items():
        click.echo(f"  {name + ' size':<32} {nbytes / 2**20:9.1f} MiB")
