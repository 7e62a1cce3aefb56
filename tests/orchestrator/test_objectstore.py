"""ObjectStore against the session's real S3 endpoint: whole objects in and out, and every
failure as the project's error with the URI in it."""

from __future__ import annotations

import os
import socket
import uuid
from pathlib import Path

import pytest

from orchestrator.errors import (
    InputMissing,
    InputTooLarge,
    InvalidRequest,
    StorageError,
    StorageUnavailable,
)
from orchestrator.objectstore import ObjectStore
from orchestrator.settings import Settings, load_settings


def _settings(
    tmp_path: Path, endpoint: str, keys: tuple[str, str], bucket: str = "cdiflow"
) -> Settings:
    return load_settings(
        data_dir=tmp_path,
        s3_endpoint_url=endpoint,
        s3_bucket=bucket,
        aws_access_key_id=keys[0],
        aws_secret_access_key=keys[1],
        aws_region="us-east-1",
    )


@pytest.fixture
def store(tmp_path: Path, s3_endpoint: str, s3_keys: tuple[str, str]) -> ObjectStore:
    return ObjectStore(_settings(tmp_path, s3_endpoint, s3_keys))


def test_put_get_delete_round_trip(store: ObjectStore) -> None:
    uri = store.uri(f"tests/objectstore/{uuid.uuid4()}.bin")
    data = os.urandom(300_000)
    store.put(uri, data, content_type="image/png")
    assert store.get(uri, limit=len(data)) == data
    store.delete(uri)
    with pytest.raises(InputMissing, match="does not exist"):
        store.get(uri, limit=len(data))


def test_a_head_tells_the_tag_a_get_sees_and_a_new_one_after_a_change(
    store: ObjectStore,
) -> None:
    """What the input cache keys on: the HEAD's ETag is the GET's, and changes with the bytes;
    a missing object, or one outside the policy, is refused as a GET would be."""
    uri = store.uri(f"tests/objectstore/{uuid.uuid4()}.bin")
    store.put(uri, b"first")
    head = store.head(uri)
    data, got = store.get_stored(uri, limit=100)
    assert data == b"first" and head.size == 5 and head.etag and got == head
    store.put(uri, b"second")
    assert store.head(uri).etag not in (None, head.etag)
    store.delete(uri)
    with pytest.raises(InputMissing, match="does not exist"):
        store.head(uri)
    with pytest.raises(InvalidRequest):
        store.head("s3://cdiflow/../x")


def test_a_head_outside_the_inputs_is_refused_before_any_request(
    tmp_path: Path, s3_endpoint: str, s3_keys: tuple[str, str]
) -> None:
    settings = _settings(tmp_path, s3_endpoint, s3_keys).model_copy(
        update={"s3_inputs": ["s3://cdiflow/inputs-only/"]}
    )
    with pytest.raises(InvalidRequest, match="outside the S3 locations"):
        ObjectStore(settings, enforce=True).head("s3://cdiflow/elsewhere/a.jpg")


def test_an_object_over_the_limit_is_refused_with_its_size(store: ObjectStore) -> None:
    uri = store.uri(f"tests/objectstore/{uuid.uuid4()}.bin")
    store.put(uri, b"x" * 1001)
    with pytest.raises(InputTooLarge, match="1001 bytes; the limit is 1000"):
        store.get(uri, limit=1000)


def test_a_missing_bucket_reads_as_a_missing_input(store: ObjectStore) -> None:
    with pytest.raises(InputMissing, match="s3://no-such-bucket-here/x does not exist"):
        store.get("s3://no-such-bucket-here/x", limit=10)


def test_a_bad_uri_is_a_request_error(store: ObjectStore) -> None:
    with pytest.raises(InvalidRequest, match="not an S3 URI"):
        store.get("http://example.com/x.png", limit=10)


def test_an_endpoint_that_is_down_fails_fast_with_the_uri(tmp_path: Path) -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    store = ObjectStore(_settings(tmp_path, f"http://127.0.0.1:{port}", ("any", "key")))
    # An outage, which the scheduler waits out, not a refusal.
    with pytest.raises(StorageUnavailable, match=r"cannot read s3://cdiflow/x\.png: S3 did not"):
        store.get(store.uri("x.png"), limit=10)
    with pytest.raises(StorageUnavailable, match=r"cannot write s3://cdiflow/y\.png"):
        store.put(store.uri("y.png"), b"data")


def test_a_refusal_is_not_taken_for_an_outage(
    tmp_path: Path, s3_endpoint: str, s3_keys: tuple[str, str]
) -> None:
    wrong = ObjectStore(_settings(tmp_path, s3_endpoint, (s3_keys[0], "not-" + s3_keys[1])))
    with pytest.raises(StorageError, match=r"cannot write s3://cdiflow/z\.png") as caught:
        wrong.put(wrong.uri("z.png"), b"data")
    assert not isinstance(caught.value, StorageUnavailable), caught.value


def test_no_credentials_anywhere_is_a_clear_error_at_the_first_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    settings = load_settings(
        data_dir=tmp_path,
        s3_endpoint_url="http://192.0.2.1:9000",  # never reached: no key to sign with
        s3_bucket="cdiflow",
        aws_access_key_id=None,
        aws_secret_access_key=None,
        aws_region="us-east-1",
    )
    store = ObjectStore(settings)  # a stack that moves no images needs no key
    with pytest.raises(StorageError, match="no S3 credentials: set AWS_ACCESS_KEY_ID"):
        store.get(store.uri("x.png"), limit=10)
