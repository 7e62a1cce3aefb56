"""Inputs in and results out through the API: upload checks and the result download, on the
real app with the session's Postgres, Redis and S3 endpoint."""

from __future__ import annotations

import io
import uuid
from pathlib import Path

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

MAX_INPUT = 200_000
MAX_PIXELS = 1_000_000


@pytest.fixture(scope="module")
def api_settings(
    tmp_path_factory: pytest.TempPathFactory,
    api_database_url: str,
    api_redis_url: str,
    service_stack: RunningServices,
) -> Settings:
    """This module's app reaches the session's S3 endpoint, with small limits."""
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
    )


def _image(fmt: str, size: tuple[int, int] = (64, 48)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, (200, 30, 30)).save(out, fmt)
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


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"just some text, not a picture", "not a recognised image file"),
        (b"", "empty input"),
        (_image("PNG", (1200, 1000)), "over the limit of 1000000"),
        (_image("PPM"), "is a PPM image; upload one of BMP, GIF, JPEG, PNG, TIFF, WEBP"),
    ],
)
def test_an_upload_that_is_not_a_usable_image_gets_a_422_saying_why(
    api_client: TestClient, content: bytes, expected: str
) -> None:
    reply = api_client.post("/api/inputs", files={"file": ("x.bin", content, "image/png")})
    assert reply.status_code == 422, reply.text
    assert expected in reply.json()["detail"] and reply.json()["problems"]


def test_an_upload_over_the_input_limit_gets_a_413(api_client: TestClient) -> None:
    big = b"\xff\xd8" + b"\0" * MAX_INPUT
    reply = api_client.post("/api/inputs", files={"file": ("big.jpg", big, "image/jpeg")})
    assert reply.status_code == 413, reply.text
    assert "MAX_INPUT_BYTES" in reply.json()["detail"]
    # Far over: the body is refused before it is read.
    huge = b"\xff\xd8" + b"\0" * (MAX_INPUT + 100_000)
    refused = api_client.post("/api/inputs", files={"file": ("huge.jpg", huge, "image/jpeg")})
    assert refused.status_code == 413 and refused.json()["detail"].startswith("an upload is")
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


def _finish(sessions: sessionmaker[Session], run_id: str, uri: str) -> None:
    """What a scheduler writes when the last task has stored the result."""
    with sessions() as session, session.begin():
        row = session.get(Workflow, uuid.UUID(run_id))
        assert row is not None
        row.status, row.result_uri = WorkflowStatus.COMPLETED, uri
