"""The check of a point's stored results, on the test session's S3 endpoint.

A correct result passes; a missing one, one too many, other pixels, an undecodable file and a
result of no input's size each fail the point with a reason.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from loadtest.images import make_jpeg
from loadtest.pipeline_ops import RESULT_FORMAT, apply_op
from loadtest.stats import WorkflowRecord
from loadtest.systems.services import clear_prefixes, s3_client
from loadtest.verify import ReferenceBook, verify_point
from orchestrator.services import RunningServices
from workflows.imagebuf import RESULT_FORMATS, decode_bytes, encode_image

SIZE = 10_000


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    path = tmp_path_factory.mktemp("verify") / "input.jpg"
    path.write_bytes(make_jpeg(SIZE))
    return {SIZE: path}


def _result(path: Path, *, lossy_between: bool = False) -> bytes:
    """What a system stores for ``path`` through the 3-task pipeline."""
    img = decode_bytes(path.read_bytes())
    for i, op in enumerate(("deblur", "denoise", "classify")):
        img, _ = apply_op(op, img)
        if lossy_between and i < 2:
            img = decode_bytes(encode_image(img, "JPEG"))
    return encode_image(img, RESULT_FORMATS[RESULT_FORMAT].pillow)


def _completed(n: int) -> list[WorkflowRecord]:
    return [WorkflowRecord("x", SIZE, 3, 1.0, 2.0, "COMPLETED") for _ in range(n)]


def _store(services: RunningServices, prefix: str, blobs: list[bytes]) -> None:
    s3 = s3_client(services)
    for blob in blobs:
        key = f"{prefix}{uuid.uuid4().hex}.jpg"
        s3.put_object(Bucket=services.s3_bucket, Key=key, Body=blob)


def test_results_are_held_to_the_reference_of_their_input(
    service_stack: RunningServices, inputs: dict[int, Path]
) -> None:
    book = ReferenceBook(inputs)
    lossless = book.for_point((SIZE,), 3, "raw")
    assert book.for_point((SIZE,), 3, "png") == lossless  # both lossless: one reference
    good, lossy = _result(inputs[SIZE]), _result(inputs[SIZE], lossy_between=True)
    prefix = f"verify-{uuid.uuid4().hex}/"
    try:
        _store(service_stack, prefix, [good, good])
        check = verify_point(service_stack, prefix, _completed(2), lossless)
        assert check == {"ok": True, "completed": 2, "stored": 2, "matched": 2, "problems": []}

        # One completed workflow more than results stored.
        check = verify_point(service_stack, prefix, _completed(3), lossless)
        assert not check["ok"] and "2 results stored for 3 completed" in check["problems"][0]

        # The pipeline with JPEG between tasks: other pixels than the lossless reference's,
        # and exactly those of the lossy one.
        clear_prefixes(service_stack, (prefix,))
        _store(service_stack, prefix, [lossy])
        check = verify_point(service_stack, prefix, _completed(1), lossless)
        assert not check["ok"] and "other pixels" in check["problems"][0]
        jpeg_reference = book.for_point((SIZE,), 3, "jpeg")
        assert verify_point(service_stack, prefix, _completed(1), jpeg_reference)["ok"]

        # A truncated file and a result of no input's size.
        clear_prefixes(service_stack, (prefix,))
        small = encode_image(decode_bytes(good).resize((8, 8)), "JPEG")
        _store(service_stack, prefix, [good[: len(good) // 3], small])
        check = verify_point(service_stack, prefix, _completed(2), lossless)
        problems = " | ".join(check["problems"])
        assert not check["ok"] and check["matched"] == 0
        assert "not decodable" in problems and "8x8 is no input's result size" in problems
    finally:
        clear_prefixes(service_stack, (prefix,))
