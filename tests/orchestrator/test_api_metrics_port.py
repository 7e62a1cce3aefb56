"""The API's scrape port (``--metrics-port``): Prometheus's figures without a key, for a
scraper that holds none, while the API's own port keeps ``/metrics`` behind a key. The real API
process on the module's Postgres and Redis."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.apikeys import generate_key
from orchestrator.child_process import free_port
from orchestrator.services import RunningServices


@pytest.fixture(scope="module")
def api_process(
    api_database_url: str,
    api_redis_url: str,
    service_stack: RunningServices,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[str, str]]:
    """``python -m orchestrator.controller --metrics-port M``: (its URL, its scrape URL)."""
    port, metrics_port = free_port(), free_port()
    env = {
        "PATH": os.environ["PATH"],
        "DATABASE_URL": api_database_url,
        "REDIS_URL": api_redis_url,
        "S3_ENDPOINT_URL": service_stack.s3_endpoint_url,
        "S3_BUCKET": service_stack.s3_bucket,
        "AWS_ACCESS_KEY_ID": service_stack.aws_access_key_id or "",
        "AWS_SECRET_ACCESS_KEY": service_stack.aws_secret_access_key or "",
        "CDIFLOW_ADMIN_KEY": generate_key(),
    }
    folder: Path = tmp_path_factory.mktemp("api-metrics")
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.controller", "--port", str(port),
         "--metrics-port", str(metrics_port)],
        env=env, cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.communicate()[1].decode()
            try:
                if httpx.get(f"{url}/api/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the API did not answer within 60 s"
            time.sleep(0.1)
        yield url, f"http://127.0.0.1:{metrics_port}/metrics"
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def test_the_scrape_port_needs_no_key_and_the_api_port_still_does(
    api_process: tuple[str, str],
) -> None:
    url, scrape = api_process
    reply = httpx.get(scrape, timeout=30)
    assert reply.status_code == 200, reply.text
    families = {f.name: f for f in text_string_to_metric_families(reply.text)}
    sources = {s.labels["source"]: s.value for s in families["cdiflow_source_up"].samples}
    assert sources["postgres"] == 1 and sources["redis"] == 1
    assert "cdiflow_workflows" in families
    assert httpx.get(f"{url}/metrics", timeout=30).status_code == 401
