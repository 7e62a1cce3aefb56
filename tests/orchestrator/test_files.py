"""Inputs in and results out through the API: upload checks and the result download, on the
real app with the session's Postgres, Redis and S3 endpoint."""

from __future__ import annotations

import io
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from PIL import Image
from sqlalchemy.orm import Session, sessionmaker

from orchestrator.contract.vocabulary import WorkflowStatus
from orchestrator.db.models import Workflow
from orchestrator.objectstore import ObjectStore
from orchestrator.services import RunningServices
from orchestrator.settings import Settings
from tests.orchestrator.api_support import api_test_settings
from workflows.ar.sample import SampleVideo, make_sample_video

MAX_INPUT = 200_000
MAX_UPLOAD = 150_000
MAX_PIXELS = 1_000_000
# This module's operator takes these (the default takes text and more: test_settings).
UPLOAD_TYPES = ["image/*", "video/mp4", "application/x-npy", "application/json",
                "application/octet-stream"]  # fmt: skip


@pytest.fixture(scope="module")
def api_settings(
    tmp_path_factory: pytest.TempPathFactory,
    api_database_url: str,
    api_redis_url: str,
    service_stack: RunningServices,
) -> Settings:
    """This module's app reaches the session's S3 endpoint, with small limits and its own
    upload policy."""
    data_dir: Path = tmp_path_factory.mktemp("files")
    return api_test_settings(
        data_dir,
        api_database_url,
        api_redis_url,
        s3_endpoint_url=service_stack.s3_endpoint_url,
        s3_bucket=service_stack.s3_bucket,
        aws_access_key_id=service_stack.aws_access_key_id,
        aws_secret_access_key=service_stack.aws_secret_access_key,
        aws_region=service_stack.aws_region,
        max_input_bytes=MAX_INPUT,
        max_pixels=MAX_PIXELS,
        upload_max_bytes=MAX_UPLOAD,
        upload_types=",".join(UPLOAD_TYPES),
    )


def _image(fmt: str, size: tuple[int, int] = (64, 48)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, (200, 30, 30)).save(out, fmt)
    return out.getvalue()


def _npy(value: np.ndarray[Any, Any]) -> bytes:
    out = io.BytesIO()
    np.save(out, value, allow_pickle=True)
    return out.getvalue()


def test_an_upload_is_stored_and_described(api_client: TestClient, api_settings: Settings) -> None:
    data = _image("JPEG")
    reply = api_client.post("/api/inputs", files={"file": ("my photo.jpg", data, "image/jpeg")})
    assert reply.status_code == 201, reply.text
    body = reply.json()
    assert body["uri"].startswith(f"s3://{api_settings.s3_bucket}/uploads/")
    assert body["uri"].endswith("/my_photo.jpg")
    assert (body["format"], body["width"], body["height"]) == ("JPEG", 64, 48)
    assert (body["bytes"], body["content_type"]) == (len(data), "image/jpeg")
    assert ObjectStore(api_settings).get(body["uri"], MAX_INPUT) == data
    second = api_client.post("/api/inputs", files={"file": ("my photo.jpg", data, "image/jpeg")})
    assert second.json()["uri"] != body["uri"]  # uploads never overwrite each other


def small_video(tmp_path: Path) -> bytes:
    """A few frames of the AR sample video, as MP4."""
    sample = SampleVideo(width=160, height=96, frames=5)
    return make_sample_video(tmp_path / "people.mp4", sample).read_bytes()


@pytest.mark.parametrize(
    ("name", "make", "content_type", "stored_as"),
    [
        ("people.mp4", small_video, "video/mp4", "/people.mp4"),
        ("values", lambda _: _npy(np.arange(12.0).reshape(3, 4)), "application/x-npy",
         "/values.npy"),
        ("raw.dat", lambda _: bytes(range(256)) * 4, "application/octet-stream", "/raw.dat"),
        ("data.json", lambda _: b'{"n": [1, 2, 3]}', "application/json", "/data.json"),
    ],
)  # fmt: skip
def test_any_file_the_policy_takes_is_stored_with_the_type_its_bytes_have(
    api_client: TestClient,
    api_settings: Settings,
    tmp_path: Path,
    name: str,
    make: Callable[[Path], bytes],
    content_type: str,
    stored_as: str,
) -> None:
    content = make(tmp_path)
    # The type a client declares is not trusted: each is sent as text/plain.
    reply = api_client.post("/api/inputs", files={"file": (name, content, "text/plain")})
    assert reply.status_code == 201, reply.text
    body = reply.json()
    assert (body["content_type"], body["bytes"]) == (content_type, len(content))
    assert (body["format"], body["width"], body["height"]) == (None, None, None)
    assert body["uri"].endswith(stored_as)
    stored = ObjectStore(api_settings).stream(body["uri"])
    assert stored.content_type == content_type and b"".join(stored.chunks) == content


@pytest.mark.parametrize(
    ("content", "status", "expected"),
    [
        (b"", 422, "the file is empty"),
        (_image("PNG", (1200, 1000)), 422, "over the limit of 1000000"),
        (b"\x89PNG\r\n\x1a\n" + b"\0" * 64, 422, "not a recognised image file"),
        (_npy(np.array([{}, None], dtype=object)), 422, "holds Python objects"),
        (b"just some text, not a picture", 415, "x.bin is text/plain, which this cdiflow does "
         "not take; it takes image/*, video/mp4, application/x-npy, application/json, "
         "application/octet-stream (CDIFLOW_UPLOAD_TYPES)"),
        (b"<html><script>alert(1)</script></html>", 415, "x.bin is text/html"),
    ],
)  # fmt: skip
def test_an_upload_the_policy_refuses_gets_a_4xx_saying_why(
    api_client: TestClient, content: bytes, status: int, expected: str
) -> None:
    reply = api_client.post("/api/inputs", files={"file": ("x.bin", content, "image/png")})
    assert reply.status_code == status, reply.text
    assert expected in reply.json()["detail"] and reply.json()["problems"]


def test_an_upload_over_the_size_limit_gets_a_413_naming_it(api_client: TestClient) -> None:
    big = b"\xff\xd8" + b"\0" * MAX_UPLOAD
    reply = api_client.post("/api/inputs", files={"file": ("big.jpg", big, "image/jpeg")})
    assert reply.status_code == 413, reply.text
    detail = reply.json()["detail"]
    assert f"big.jpg is larger than the {MAX_UPLOAD}-byte limit" in detail
    assert "CDIFLOW_UPLOAD_MAX_BYTES" in detail
    # Far over: the body is refused before it is read.
    huge = b"\xff\xd8" + b"\0" * (MAX_UPLOAD + 100_000)
    refused = api_client.post("/api/inputs", files={"file": ("huge.jpg", huge, "image/jpeg")})
    assert refused.status_code == 413 and refused.json()["detail"].startswith("an upload is")
    assert "CDIFLOW_UPLOAD_MAX_BYTES" in refused.json()["detail"]
    missing = api_client.post("/api/inputs", data={"other": "x"})
    assert missing.status_code == 422 and "file" in reply.text + missing.text


def test_a_completed_runs_result_downloads_as_stored(
    api_client: TestClient,
    api_settings: Settings,
    api_sessions: sessionmaker[Session],
) -> None:
    run = api_client.post("/api/workflows", json={"workflow": "image_pipeline", "input": {}})
    run_id = run.json()["id"]
    early = api_client.get(f"/api/workflows/{run_id}/result")
    assert early.status_code == 409 and "has not finished" in early.json()["detail"]

    png = _image("PNG")
    uri = f"s3://{api_settings.s3_bucket}/results/{uuid.uuid4()}.png"
    ObjectStore(api_settings).put(uri, png, "image/png")
    _finish(api_sessions, run_id, uri)
    reply = api_client.get(f"/api/workflows/{run_id}/result")
    assert reply.status_code == 200, reply.text
    assert reply.content == png and reply.headers["content-type"] == "image/png"
    assert f'filename="{run_id}.png"' in reply.headers["content-disposition"]

    ObjectStore(api_settings).delete(uri)
    gone = api_client.get(f"/api/workflows/{run_id}/result")
    assert gone.status_code == 404 and uri in gone.json()["detail"]
    unknown = api_client.get(f"/api/workflows/{uuid.uuid4()}/result")
    assert unknown.status_code == 404


def test_a_failed_run_has_no_result(
    api_client: TestClient, api_sessions: sessionmaker[Session]
) -> None:
    run = api_client.post("/api/workflows", json={"workflow": "image_pipeline", "input": {}})
    api_client.post(f"/api/workflows/{run.json()['id']}/cancel")
    reply = api_client.get(f"/api/workflows/{run.json()['id']}/result")
    assert reply.status_code == 409 and "is CANCELLED" in reply.json()["detail"]


def test_every_named_result_downloads_with_its_content_type(
    api_client: TestClient,
    api_settings: Settings,
    api_sessions: sessionmaker[Session],
    tmp_path: Path,
) -> None:
    """A run without an image result: an array, a video and a list output's elements, each
    streamed with the type it was stored with; a name it did not store lists those it did."""
    run = api_client.post("/api/workflows", json={"workflow": "image_pipeline", "input": {}})
    run_id = run.json()["id"]
    early = api_client.get(f"/api/workflows/{run_id}/results/double.values")
    assert early.status_code == 409 and "has not finished" in early.json()["detail"]
    store = ObjectStore(api_settings)
    stem = f"s3://{api_settings.s3_bucket}/results/{run_id}/"
    array = _npy(np.linspace(0, 1, 50_000))  # larger than one chunk of the stream
    video = small_video(tmp_path)
    files = {
        f"{stem}double.values.npy": (array, "application/x-npy"),
        f"{stem}combine.video.mp4": (video, "video/mp4"),
        f"{stem}split.parts-0.json": (b"[1]", "application/json"),
        f"{stem}split.parts-1.json": (b"[2]", "application/json"),
    }
    for uri, (data, content_type) in files.items():
        store.put(uri, data, content_type)
    results = {
        "double.values": f"{stem}double.values.npy",
        "combine.video": f"{stem}combine.video.mp4",
        "split.parts": [f"{stem}split.parts-0.json", f"{stem}split.parts-1.json"],
        "tile.out": [f"{stem}tile.out-{i}.json" for i in range(12)],  # named as a range
    }
    _finish(api_sessions, run_id, None, {"results": results})

    for name, uri in [("double.values", f"{stem}double.values.npy"),
                      ("combine.video", f"{stem}combine.video.mp4"),
                      ("split.parts[1]", f"{stem}split.parts-1.json")]:  # fmt: skip
        reply = api_client.get(f"/api/workflows/{run_id}/results/{name}")
        assert reply.status_code == 200, reply.text
        data, content_type = files[uri]
        assert reply.content == data and reply.headers["content-type"] == content_type
        assert reply.headers["x-content-type-options"] == "nosniff"
        filename = uri.rsplit("/", 1)[-1]
        assert reply.headers["content-disposition"] == f'attachment; filename="{filename}"'
    assert np.array_equal(
        np.load(io.BytesIO(api_client.get(f"/api/workflows/{run_id}/results/double.values")
                           .content)), np.linspace(0, 1, 50_000))  # fmt: skip

    known = "combine.video, double.values, split.parts[0], split.parts[1], tile.out[0..11]"
    unknown = api_client.get(f"/api/workflows/{run_id}/results/double.other")
    assert unknown.status_code == 404 and unknown.json()["detail"].endswith(f"known: {known}")
    no_image = api_client.get(f"/api/workflows/{run_id}/result")
    assert no_image.status_code == 404 and no_image.json()["known"] == known.split(", ")
    store.delete(f"{stem}combine.video.mp4")
    gone = api_client.get(f"/api/workflows/{run_id}/results/combine.video")
    assert gone.status_code == 404 and f"{stem}combine.video.mp4" in gone.json()["detail"]


def _finish(
    sessions: sessionmaker[Session],
    run_id: str,
    uri: str | None,
    output: dict[str, Any] | None = None,
) -> None:
    """What a scheduler writes when the last task has stored the result."""
    with sessions() as session, session.begin():
        row = session.get(Workflow, uuid.UUID(run_id))
        assert row is not None
        row.status, row.result_uri, row.output = WorkflowStatus.COMPLETED, uri, output
