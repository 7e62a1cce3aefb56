"""For a person running ``locust`` with its web UI against ``cdiflow up``: find the stack's S3
and its API key.

The embedded S3 endpoint's address is in ``<data dir>/stack.json`` (the ``s3`` row); an
endpoint configured with ``S3_ENDPOINT_URL`` is used as configured. The key is
``CDIFLOW_API_KEY`` when set, else the stack's admin key file.
"""

from __future__ import annotations

import os
from pathlib import Path

import boto3

from loadtest.images import sized_images
from orchestrator.apikeys import read_key_file
from orchestrator.stack.state import read_state

__all__ = ["api_key_of", "upload_sample"]


def api_key_of(stack_dir: Path) -> str:
    """The key the users send: ``CDIFLOW_API_KEY``, else the stack's admin key."""
    configured = os.environ.get("CDIFLOW_API_KEY")
    if configured:
        return configured
    state = read_state(stack_dir.expanduser().absolute())
    if state is None or not state.api_key_file:
        raise RuntimeError(
            f"no API key: set CDIFLOW_API_KEY, or run against a stack started with `cdiflow up "
            f"--data-dir {stack_dir}`"
        )
    return read_key_file(Path(state.api_key_file))


def _s3_endpoint(stack_dir: Path) -> str:
    configured = os.environ.get("S3_ENDPOINT_URL")
    if configured:
        return configured
    state = read_state(stack_dir.expanduser().absolute())
    if state is None:
        raise RuntimeError(
            f"no stack runs from {stack_dir}; start one with `cdiflow up` or give --stack-dir"
        )
    row = next((p for p in state.processes if p.name == "s3" and p.address), None)
    if row is None:
        raise RuntimeError(f"the stack in {stack_dir} lists no S3 endpoint")
    return row.address


def upload_sample(stack_dir: Path, size: int) -> str:
    """Put a generated photo-like JPEG of ``size`` bytes in the stack's bucket; its URI."""
    bucket = os.environ.get("S3_BUCKET", "cdiflow")
    path = sized_images(stack_dir / "bench-images", [size])[size]
    s3 = boto3.client(
        "s3",
        endpoint_url=_s3_endpoint(stack_dir),
        region_name=os.environ.get("AWS_REGION", "us-east-1"),
        aws_access_key_id=os.environ.get("AWS_ACCESS_KEY_ID", "testing"),
        aws_secret_access_key=os.environ.get("AWS_SECRET_ACCESS_KEY", "testing"),
    )
    key = f"bench/{path.name}"
    s3.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())
    return f"s3://{bucket}/{key}"
