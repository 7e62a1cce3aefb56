"""One real stack for the dashboard tests (API and browser alike), with slow pipelines."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator

import boto3
import httpx
import pytest

from orchestrator.stack import Stack
from orchestrator.stack.restarts import RestartPolicy
from tests.dashboard.support import Harness, free_port


@pytest.fixture(scope="package")
def harness() -> Iterator[Harness]:
    folder = tempfile.mkdtemp(prefix="cdiflow-ui-")
    os.chmod(folder, 0o755)
    # A killed worker is restarted only after 30 s, so the dashboard has time to show it gone.
    policy = RestartPolicy(initial_backoff=30.0)
    try:
        with Stack(folder, workers=2, port=free_port(), restart_policy=policy) as stack:
            services = stack.services
            s3 = boto3.client(
                "s3",
                endpoint_url=services.s3_endpoint_url,
                region_name=services.aws_region,
                aws_access_key_id=services.aws_access_key_id,
                aws_secret_access_key=services.aws_secret_access_key,
            )
            with httpx.Client(
                base_url=stack.api_url, timeout=30, headers=stack.auth_headers
            ) as api:
                yield Harness(stack, api, s3, services.s3_bucket)
    finally:
        subprocess.run(["rm", "-rf", folder], check=False)


@pytest.fixture(scope="package")
def napping(harness: Harness) -> str:
    """Pipelines with 2.5 s steps, so the browser can watch a run while it runs."""
    harness.register(
        "/api/tasks",
        {"name": "nap", "module": "workflows.image_tasks:sleep", "timeout_s": 20},
    )
    harness.register(
        "/api/workflow-definitions",
        {
            "name": "napping_pipeline",
            "description": "Sharpen, nap, smooth, classify: a run slow enough to watch.",
            "tasks": [
                {"ref": "deblur", "task": "deblur"},
                {"ref": "nap", "task": "nap", "depends_on": ["deblur"], "params": {"ms": 2500}},
                {"ref": "denoise", "task": "denoise", "depends_on": ["nap"]},
                {"ref": "classify", "task": "classify", "depends_on": ["denoise"]},
            ],
        },
    )
    # A nap's object read by two steps: it goes back to the scheduler, which shares it with
    # both (a chain's may stay on its worker throughout).
    harness.register(
        "/api/workflow-definitions",
        {
            "name": "nap_then_fork",
            "tasks": [
                {"ref": "nap1", "task": "nap", "params": {"ms": 2500}},
                {"ref": "nap2", "task": "nap", "inputs": {"img": "nap1.image"},
                 "params": {"ms": 2500}},
                {"ref": "label", "task": "classify", "inputs": {"img": "nap1.image"}},
            ],
        },
    )  # fmt: skip
    # Two naps in a row keep one CDI object alive, on its worker or across a hand-off.
    harness.register(
        "/api/workflow-definitions",
        {
            "name": "double_nap",
            "tasks": [
                {"ref": "nap1", "task": "nap", "params": {"ms": 2500}},
                {"ref": "nap2", "task": "nap", "depends_on": ["nap1"], "params": {"ms": 2500}},
                {"ref": "classify", "task": "classify", "depends_on": ["nap2"]},
            ],
        },
    )
    return "napping_pipeline"
