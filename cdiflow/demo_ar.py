"""The AR video in ``cdiflow demo``: three seconds of the generated sample video through the
bundled ``ar_video`` workflow (decode, one ``detect`` step per frame across the workers,
combine), its output video copied out of S3."""

from __future__ import annotations

import importlib.util
import tempfile
from pathlib import Path
from typing import Any, Final

import httpx

from orchestrator.contract.vocabulary import Policy

__all__ = [
    "AR_SAMPLE_KEY",
    "AR_WORKFLOW",
    "ar_available",
    "demo_sample",
    "start_ar_video",
    "video_uri",
]

AR_WORKFLOW: Final = "ar_video"
AR_SAMPLE_KEY: Final = "samples/ar-sample.mp4"


def ar_available() -> bool:
    """Whether the optional ``ar`` dependencies (PyAV, OpenCV) are installed here."""
    return all(importlib.util.find_spec(name) is not None for name in ("av", "cv2"))


def demo_sample() -> Any:
    """The demo's video: 3 s at 25 fps, 640x360 (a ``workflows.ar.sample.SampleVideo``)."""
    from workflows.ar.sample import SampleVideo  # the optional ``ar`` dependencies

    return SampleVideo(width=640, height=360, frames=75)


def start_ar_video(
    api: httpx.Client, s3: Any, bucket: str, sample: Any = None, key: str = AR_SAMPLE_KEY
) -> tuple[str, str]:
    """Render ``sample`` (default ``demo_sample()``), upload it to ``s3://bucket/key`` and start
    ``ar_video`` on it; the run's id and the video's URI."""
    from workflows.ar.sample import make_sample_video

    with tempfile.TemporaryDirectory(prefix="cdiflow-ar-demo-") as folder:
        path = make_sample_video(Path(folder) / "sample.mp4", sample or demo_sample())
        s3.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())
    uri = f"s3://{bucket}/{key}"
    body = {"workflow": AR_WORKFLOW, "input": {"data": {"video": uri}}, "policy": Policy.TRANSFER}
    run_id: str = api.post("/api/workflows", json=body).raise_for_status().json()["id"]
    return run_id, uri


def video_uri(body: dict[str, Any]) -> str | None:
    """Where a finished ``ar_video`` run stored its output video."""
    results = (body.get("output") or {}).get("results") or {}
    uri = results.get("combine.video")
    return uri if isinstance(uri, str) else None
