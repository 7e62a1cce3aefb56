"""The AR application as the bundled ``ar_video`` workflow on a real stack (two workers as
processes, two slots each), started as ``cdiflow demo`` starts it: the generated video decoded,
one detect step per frame fanned out over both workers, the labelled frames combined into the
output video in S3; checked frame by frame against the single-process reference run. Its
streaming variant, ``ar_video_stream`` (decode, two detectors and combine running at once,
frames flowing over channels), gives the same video and boxes."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from apps.ar.launch import PipelineResult, run_floor
from cdiflow.demo_ar import demo_sample, start_ar_video, video_uri
from orchestrator.stack import Stack
from orchestrator.stack.defaults import WORKER_COMMAND
from tests.apps.ar_checks import assert_video_like_reference, config_for
from tests.orchestrator.test_e2e import Harness, free_port
from tests.orchestrator.test_e2e_graphs import _no_object_left
from workflows.ar.sample import make_sample_video
from workflows.ar.tasks import chunks_of, combine_chunks, detect_chunk
from workflows.ar.video import probe

FRAMES = 12
SAMPLE = replace(demo_sample(), frames=FRAMES)  # the demo's video, shorter


@pytest.fixture(scope="module")
def video(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_sample_video(tmp_path_factory.mktemp("ar-wf") / "in.mp4", SAMPLE)


@pytest.fixture(scope="module")
def reference(video: Path, tmp_path_factory: pytest.TempPathFactory) -> PipelineResult:
    out = tmp_path_factory.mktemp("ar-wf-floor") / "floor.mp4"
    return run_floor(replace(config_for(video), output=str(out), detectors=1))


@pytest.fixture(scope="module")
def harness() -> Iterator[Harness]:
    folder = tempfile.mkdtemp(prefix="cdiflow-ar-wf-")
    os.chmod(folder, 0o755)
    try:
        worker = (*WORKER_COMMAND, "--concurrency", "2")  # ar_video_stream's four steps at once
        with Stack(folder, workers=2, port=free_port(), worker_command=worker) as stack:
            h = Harness(stack)
            yield h
            h.api.close()
    finally:
        subprocess.run(["rm", "-rf", folder], check=False)


def _start(harness: Harness, data: dict[str, object], workflow: str = "ar_video") -> str:
    body = {"workflow": workflow, "input": {"data": data}, "policy": "transfer"}
    reply = harness.api.post("/api/workflows", json=body)
    assert reply.status_code == 201, reply.text
    workflow_id: str = reply.json()["id"]
    return workflow_id


def test_ar_video_fans_out_per_frame_and_gives_the_reference_video(
    harness: Harness, video: Path, reference: PipelineResult, tmp_path: Path
) -> None:
    workflow_id, _ = start_ar_video(harness.api, harness.s3, harness.bucket, SAMPLE, "in/ar.mp4")
    done = harness.wait(workflow_id, timeout=180)
    assert done["status"] == "COMPLETED", done["error"]

    detects = [r for r in done["task_runs"] if r["ref"].startswith("detect[")]
    assert sorted(r["ref"] for r in detects) == sorted(f"detect[{i}]" for i in range(FRAMES))
    assert {r["status"] for r in detects} == {"COMPLETED"}
    assert len({r["worker_id"] for r in detects}) == 2  # spread over both workers
    # Every frame moved as a CDI object: decode's to its detect step, each detect's to combine.
    moved = {str(x["datum"]) for x in done["handoffs"] if x["mode"] == "transfer" and x["bytes"]}
    decoded = {f"decode.frames.{i}" for i in range(FRAMES)}
    labelled = {f"detect[{i}].frames" for i in range(FRAMES)}
    assert decoded | labelled <= moved, moved

    output = done["output"]
    assert output["frame_count"] == FRAMES
    out = tmp_path / "out.mp4"
    uri = video_uri(done)
    assert uri is not None, output
    out.write_bytes(harness.download(uri))
    assert_video_like_reference(output["boxes"], out, reference, FRAMES)
    _no_object_left(harness, workflow_id)


def test_ar_video_stream_gives_the_same_video_and_boxes_with_every_step_at_once(
    harness: Harness, video: Path, reference: PipelineResult, tmp_path: Path
) -> None:
    uri = harness.upload("in/ar-stream.mp4", video.read_bytes())
    done = harness.wait(_start(harness, {"video": uri}, "ar_video_stream"), timeout=180)
    assert done["status"] == "COMPLETED", done["error"]
    runs = {r["ref"]: r for r in done["task_runs"]}
    assert {"decode", "detect0", "detect1", "combine"} <= runs.keys()
    assert runs["detect0"]["output"]["frames"] + runs["detect1"]["output"]["frames"] == FRAMES
    output = done["output"]
    assert output["frame_count"] == FRAMES
    out = tmp_path / "out.mp4"
    result = video_uri(done)
    assert result is not None, output
    out.write_bytes(harness.download(result))
    assert_video_like_reference(output["boxes"], out, reference, FRAMES)
    _no_object_left(harness, done["id"])


def test_a_video_outside_the_input_locations_or_not_a_video_fails_with_a_reason(
    harness: Harness,
) -> None:
    not_video = harness.upload("in/not-a-video.mp4", b"no video here")
    cases: list[tuple[dict[str, object], str]] = [
        ({"video": not_video}, "not a video FFmpeg can read"),
        ({"video": "/etc/passwd"}, "must be the s3:// URI of a video"),
        ({"video": "s3://elsewhere/in.mp4"}, "outside the S3 locations this cdiflow reads"),
        ({"video": not_video, "frames": 0}, "input.data.frames must be a positive integer"),
    ]
    for data, reason in cases:
        done = harness.wait(_start(harness, data))
        assert done["status"] == "FAILED", done
        assert reason in done["error"], done["error"]
        _no_object_left(harness, done["id"])


def test_chunks_of_several_frames_give_the_reference_video_too(
    video: Path, reference: PipelineResult, tmp_path: Path
) -> None:
    chunks = chunks_of(video, 5, None)
    assert [len(c) for c in chunks] == [5, 5, 2]  # the last chunk is short
    labelled = [detect_chunk(chunk) for chunk in chunks]
    out = tmp_path / "out.mp4"
    assert combine_chunks([drawn for drawn, _ in labelled], probe(video).fps, out) == FRAMES
    boxes = [frame for _, found in labelled for frame in found]
    assert_video_like_reference(boxes, out, reference, FRAMES)
    assert chunks_of(video, 1, 4)[-1].shape == (1, SAMPLE.height, SAMPLE.width, 3)
