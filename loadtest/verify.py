"""Every point's results checked: as many stored as completed, each the expected pixels.

A throughput figure means nothing if a system stored fewer results than it reported, or
other pixels. So after each point (outside its measured window) every result the system
stored under its ``results_prefix`` is read back from S3, decoded and hashed, and set
against a *reference*: the same input run through the same operations in this process,
encoded as every system encodes its result (``pipeline_ops.RESULT_FORMAT``). Every system
is held to the same reference, so the check is also that all systems' pixels are equal.

Systems that pass images through S3 between tasks in a lossy format (``--intermediate
jpeg``) are held to a reference that makes the same round trips; every other system (the
cdi plane moves pixels, Ray passes arrays, ``png`` and ``raw`` are lossless) to the
lossless one.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from PIL import Image

from loadtest.images import chain_ops
from loadtest.pipeline_ops import RESULT_FORMAT, apply_op
from loadtest.stats import WorkflowRecord
from orchestrator.services import RunningServices
from workflows.imagebuf import RESULT_FORMATS, decode_bytes, encode_image, normalize_mode

__all__ = ["LOSSY_INTERMEDIATES", "Reference", "ReferenceBook", "pixel_digest", "verify_point"]

LOSSY_INTERMEDIATES: Final = frozenset({"jpeg"})
_READERS: Final = 2  # threads reading results back: decoding releases the GIL
_PROBLEMS_KEPT: Final = 5


@dataclass(frozen=True)
class Reference:
    """What a correct result of one input looks like."""

    size: int  # input bytes (the benchmark's size label)
    width: int
    height: int
    digest: str  # sha256 of the decoded result's pixels


def pixel_digest(img: Image.Image) -> str:
    return hashlib.sha256(img.mode.encode() + img.tobytes()).hexdigest()


def _reference(path: Path, size: int, tasks: int, intermediate: str) -> Reference:
    img = normalize_mode(decode_bytes(path.read_bytes()))
    ops = chain_ops(tasks)
    lossy = intermediate in LOSSY_INTERMEDIATES
    for i, op in enumerate(ops):
        img, _ = apply_op(op, img)
        if lossy and i < len(ops) - 1:  # stored and read back between tasks
            img = decode_bytes(encode_image(img, RESULT_FORMATS[intermediate].pillow))
    stored = decode_bytes(encode_image(img, RESULT_FORMATS[RESULT_FORMAT].pillow))
    return Reference(size, stored.width, stored.height, pixel_digest(stored))


class ReferenceBook:
    """References by (input size, tasks, lossy or not), computed once each."""

    def __init__(self, paths: dict[int, Path]) -> None:
        self._paths = paths
        self._known: dict[tuple[int, int, str], Reference] = {}

    def for_point(self, sizes: Iterable[int], tasks: int, intermediate: str) -> list[Reference]:
        kind = intermediate if intermediate in LOSSY_INTERMEDIATES else "lossless"
        out = []
        for size in sizes:
            key = (size, tasks, kind)
            if key not in self._known:
                self._known[key] = _reference(self._paths[size], size, tasks, intermediate)
            out.append(self._known[key])
        return out


def _read(s3: Any, bucket: str, key: str) -> tuple[str, tuple[int, int] | None, str]:
    """``(key, (width, height) or None if undecodable, digest or the decode error)``."""
    data = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    try:
        img = decode_bytes(data)
    except Exception as exc:  # InvalidImage and whatever Pillow raises on a bad file
        return key, None, f"{type(exc).__name__}: {exc}"
    return key, (img.width, img.height), pixel_digest(img)


def verify_point(
    services: RunningServices,
    prefix: str,
    records: Sequence[WorkflowRecord],
    references: Sequence[Reference],
) -> dict[str, Any]:
    """The check of one point: ``{"ok", "completed", "stored", "matched", "problems"}``.

    ``ok`` holds when the results under ``prefix`` are exactly one per completed workflow
    (by input size, too) and each decodes to its input's reference pixels.
    """
    from loadtest.systems.services import s3_client  # boto3: only when a point is checked

    s3, bucket = s3_client(services), services.s3_bucket
    keys = [
        obj["Key"]
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        for obj in page.get("Contents", [])
    ]
    with ThreadPoolExecutor(_READERS) as pool:
        read = list(pool.map(lambda key: _read(s3, bucket, key), keys))
    by_shape = {(r.width, r.height): r for r in references}
    problems: list[str] = []
    matched: Counter[int] = Counter()
    for key, shape, digest in read:
        ref = by_shape.get(shape) if shape is not None else None
        if shape is None:
            problems.append(f"{key}: not decodable ({digest})")
        elif ref is None:
            problems.append(f"{key}: {shape[0]}x{shape[1]} is no input's result size")
        elif digest != ref.digest:
            problems.append(f"{key}: other pixels than the reference's ({ref.size} B input)")
        else:
            matched[ref.size] += 1
    completed = Counter(r.size for r in records if r.status == "COMPLETED")
    if len(keys) != sum(completed.values()):
        problems.insert(0, f"{len(keys)} results stored for {sum(completed.values())} completed")
    elif not problems and matched != completed:
        problems.append(f"results by input size {dict(matched)} != completed {dict(completed)}")
    return {
        "ok": not problems,
        "completed": sum(completed.values()),
        "stored": len(keys),
        "matched": sum(matched.values()),
        "problems": problems[:_PROBLEMS_KEPT] + (["..."] if len(problems) > _PROBLEMS_KEPT else []),
    }
