"""The object-store plane: a task reads its image from S3 and puts its result there."""

from __future__ import annotations

import uuid
from typing import Any

from tests.orchestrator.worker.support import (
    BUCKET,
    Stack,
    WorkerProcess,
    picture,
    same_pixels,
    unsharp,
)
from workflows.imagebuf import decode_bytes, encode_image


def test_object_store_plane_gets_runs_and_puts(
    stack: Stack, worker: WorkerProcess, s3: Any
) -> None:
    img = picture()
    prefix = f"worker-test/{uuid.uuid4().hex}"
    encoded = encode_image(img, "PNG")
    s3.put_object(Bucket=BUCKET, Key=f"{prefix}/in.png", Body=encoded)
    for task, expected in (("deblur", unsharp(img)), ("classify", img)):
        report = stack.run(worker, task=task, data_plane="object-store",
                           input_uri=f"s3://{BUCKET}/{prefix}/in.png",
                           output_uri=f"s3://{BUCKET}/{prefix}/{task}.png")  # fmt: skip
        assert report.status == "COMPLETED", report.error
        body = s3.get_object(Bucket=BUCKET, Key=f"{prefix}/{task}.png")["Body"].read()
        assert same_pixels(decode_bytes(body), expected)
        assert (report.bytes_in, report.bytes_out) == (len(encoded), len(body))
    assert report.output["label"]
    missing = f"s3://{BUCKET}/{prefix}/missing.png"
    report = stack.run(worker, task="deblur", data_plane="object-store", input_uri=missing,
                       output_uri=f"s3://{BUCKET}/{prefix}/out.png")  # fmt: skip
    assert (report.status, report.retryable) == ("FAILED", False)
    assert missing in report.error
