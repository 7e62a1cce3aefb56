"""Any file in and out through the product, on the real stack: an MP4 goes in through
``cdiflow run`` and the ``ar_video`` workflow's video comes out through ``cdiflow workflows
result``; a NumPy workflow's ``.npy`` results come out and ``numpy.load`` reads them; the SDK
does the same with ``files=`` and ``save_result``."""

from __future__ import annotations

import asyncio
import io
import json
import re
from pathlib import Path

import numpy as np
import pytest

from cdiflow.client import AsyncClient, Client, NotFound
from tests.client.conftest import StackApi, unique
from tests.client.test_cli import UUID, CliRunnerCommand, cdiflow
from workflows.ar.sample import SampleVideo, make_sample_video
from workflows.ar.video import probe, read_frames

__all__ = ["cdiflow"]

FRAMES = 8


@pytest.fixture(scope="module")
def video(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("video")
    sample = SampleVideo(width=320, height=180, frames=FRAMES)
    return make_sample_video(folder / "people.mp4", sample)


def test_an_mp4_goes_in_and_the_ar_video_comes_out_through_the_cli(
    cdiflow: CliRunnerCommand, video: Path, tmp_path: Path
) -> None:
    out = tmp_path / "labelled.mp4"
    ran = cdiflow("run", "ar_video", "--input", f"video={video}", "--out", out)
    assert f"uploading {video}" in ran.output and "COMPLETED in" in ran.output, ran.output
    assert f"saved the result to {out}" in ran.output
    labelled = probe(out)
    assert (labelled.width, labelled.height) == (320, 180)
    assert len(list(read_frames(out))) == FRAMES
    run_id = re.search(f"run ({UUID})", ran.output)
    assert run_id, ran.output
    again = tmp_path / "again.mp4"
    saved = cdiflow("workflows", "result", run_id[1], "combine.video", "-o", again)
    assert f"saved {out.stat().st_size} bytes (video/mp4) to {again}" in saved.output
    assert again.read_bytes() == out.read_bytes()


def test_a_video_given_as_the_image_is_refused_with_what_to_do(
    cdiflow: CliRunnerCommand, video: Path
) -> None:
    refused = cdiflow("run", "ar_video", "--input", video, code=2)
    assert "is video/mp4, not an image" in refused.output
    assert f"--input video={video}" in refused.output


def test_numpy_results_come_out_through_the_cli_and_numpy_loads_them(
    cdiflow: CliRunnerCommand, api: Client, video: Path, tmp_path: Path
) -> None:
    """A workflow of one step that decodes a video into arrays, one result a frame."""
    name = unique("frames")
    api.apply_definition({"name": name, "tasks": [{"ref": "decode", "task": "ar_decode"}]})
    ran = cdiflow("run", name, "-i", f"video={video}", "--data", '{"frames": 3}', "--wait",
                  "--json")  # fmt: skip
    run = json.loads(ran.output)
    assert run["status"] == "COMPLETED" and len(run["output"]["results"]["decode.frames"]) == 3
    frames = list(read_frames(video, 3))
    out = tmp_path / "frame.npy"
    saved = cdiflow("workflows", "result", run["id"], "decode.frames[2]", "--out", out)
    assert "(application/x-npy)" in saved.output
    loaded = np.load(out)
    assert loaded.shape == (1, 180, 320, 3) and np.array_equal(loaded[0], frames[2])
    several = cdiflow("workflows", "result", run["id"], "--out", tmp_path / "x", code=1)
    assert "decode.frames[0], decode.frames[1], decode.frames[2]" in several.output
    unknown = cdiflow("workflows", "result", run["id"], "decode.nothing", "-o", out, code=1)
    assert "decode.nothing" in unknown.output and "known: decode.frames[0]" in unknown.output
    assert not (tmp_path / "x").exists() and np.array_equal(np.load(out), loaded)


def test_the_sdk_takes_files_and_saves_results_streamed(
    stack_api: StackApi, api: Client, video: Path, tmp_path: Path
) -> None:
    array = np.arange(24, dtype=np.float32).reshape(4, 6)
    uploaded = api.upload(_npy_bytes(array), "values.npy")
    assert (uploaded.content_type, uploaded.format) == ("application/x-npy", None)
    run = api.run("ar_video", files={"video": video}, data={"frames": 4})
    assert run.output is not None and run.output["frame_count"] == 4
    saved = api.save_result(run.id, tmp_path / "out.mp4")  # its only result
    assert (saved.content_type, saved.bytes) == ("video/mp4", (tmp_path / "out.mp4").stat().st_size)
    assert api.download_result(run.id, output="combine.video") == saved.path.read_bytes()
    with pytest.raises(NotFound) as missing:
        api.save_result(run.id, tmp_path / "none", output="combine.other")
    assert missing.value.known == ["combine.video"] and not (tmp_path / "none").exists()

    async def in_async() -> tuple[str, bytes]:
        async with AsyncClient(stack_api.url, api_key=stack_api.key) as aio:
            again = await aio.save_result(run.id, tmp_path / "async.mp4", output="combine.video")
            return again.content_type, again.path.read_bytes()

    kind, data = asyncio.run(in_async())
    assert kind == "video/mp4" and data == saved.path.read_bytes()


def _npy_bytes(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array)
    return out.getvalue()
