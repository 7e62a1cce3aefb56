"""Fixtures shared by the whole test suite.

Real services, not mocks: one embedded Postgres, Redis and S3 endpoint per test session, started
together on first use in a temporary folder and stopped (folder removed) when the session ends.
They ignore DATABASE_URL and friends, so a developer's environment cannot point tests elsewhere.
Tests share these servers: use unique table names, keys and object keys.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from orchestrator.services import RunningServices, resolve_services
from orchestrator.settings import load_settings


@pytest.fixture(scope="session")
def service_stack() -> Iterator[RunningServices]:
    """The session's embedded Postgres, Redis and S3 (bucket ``cdiflow``), each with the
    passwords and keys generated for its folder (in the URLs and ``aws_*`` fields)."""
    data_dir = Path(tempfile.mkdtemp(prefix="cdiflow-test-"))
    try:
        settings = load_settings(
            data_dir=data_dir,
            database_url=None,
            redis_url=None,
            s3_endpoint_url=None,
            s3_bucket="cdiflow",
            aws_access_key_id=None,
            aws_secret_access_key=None,
            aws_region="us-east-1",
        )
        # durable=False: no initdb fsync, synchronous_commit off; nothing here must survive.
        with resolve_services(settings, durable=False) as services:
            yield services
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_url(service_stack: RunningServices) -> str:
    """``postgresql+psycopg://cdiflow@127.0.0.1:PORT/cdiflow`` of the session's Postgres."""
    return service_stack.database_url


@pytest.fixture(scope="session")
def redis_url(service_stack: RunningServices) -> str:
    """``redis://127.0.0.1:PORT/0`` of the session's Redis."""
    return service_stack.redis_url


@pytest.fixture(scope="session")
def s3_endpoint(service_stack: RunningServices) -> str:
    """``http://127.0.0.1:PORT`` of the session's S3 endpoint."""
    return service_stack.s3_endpoint_url


@pytest.fixture(scope="session")
def s3_keys(service_stack: RunningServices) -> tuple[str, str]:
    """The access key id and secret the session's S3 endpoint checks."""
    assert service_stack.aws_access_key_id and service_stack.aws_secret_access_key
    return service_stack.aws_access_key_id, service_stack.aws_secret_access_key


@pytest.fixture(scope="session")
def s3(s3_endpoint: str, s3_keys: tuple[str, str]) -> Any:
    """A boto3 client of the session's S3 endpoint."""
    return boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1",
                        aws_access_key_id=s3_keys[0], aws_secret_access_key=s3_keys[1])  # fmt: skip


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A data folder with a short path: a stack's minion socket under pytest's ``tmp_path``
    (deeper under parallel runs, ``popen-gw<n>/``) can pass the 107 bytes a Unix socket's
    path may have."""
    folder = Path(tempfile.mkdtemp(prefix="cdiflow-short-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
