"""The input cache end to end: a real stack with ``CDIFLOW_INPUT_CACHE=1`` (two workers on one
host), workflows started over the REST API, S3 GETs counted by the workers' own metrics."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from collections.abc import Iterator
from unittest import mock

import httpx
import pytest

import cdi
from orchestrator.stack import Stack
from tests.orchestrator.test_e2e import (
    Harness,
    assert_result_is_the_pipelines,
    free_port,
    wait_for,
)
from workflows.samples import bundled_samples

CACHE_ENV = {"CDIFLOW_INPUT_CACHE": "1", "CDIFLOW_INPUT_CACHE_MIB": "256"}
_SAMPLE = re.compile(r"^(cdiflow_worker_input_\w+?)(?:_total)? ([0-9.e+]+)$", re.M)


@pytest.fixture(scope="module")
def harness() -> Iterator[Harness]:
    folder = tempfile.mkdtemp(prefix="cdiflow-e2e-cache-")
    os.chmod(folder, 0o755)
    try:
        # The stack's processes inherit the setting.
        with (
            mock.patch.dict(os.environ, CACHE_ENV),
            Stack(folder, workers=2, port=free_port()) as stack,
        ):
            h = Harness(stack)
            yield h
            h.api.close()
            # Every workflow is finished: what the minion holds is the cache's, within budget.
            with cdi.Client(stack.minion_socket) as probe:
                left = probe.list_objects()
                assert all(o["key"].startswith("cdiflow-input-cache/") for o in left), left
                assert all(o["owner"].endswith(".input-cache") for o in left), left
                assert sum(o["size"] for o in left) <= 256 << 20
    finally:
        subprocess.run(["rm", "-rf", folder], check=False)


def input_figures(harness: Harness) -> dict[str, float]:
    """The workers' input metrics, summed over the workers."""
    total: dict[str, float] = {}
    for url in harness.stack.worker_metrics.values():
        for name, value in _SAMPLE.findall(httpx.get(url, timeout=10).text):
            total[name] = total.get(name, 0.0) + float(value)
    return total


def run_all(harness: Harness, image: str, n: int) -> list[dict[str, object]]:
    ids = [harness.start(image) for _ in range(n)]
    return [harness.wait(i) for i in ids]


def test_workflows_on_one_input_fetch_it_once_and_again_when_it_changes(
    harness: Harness,
) -> None:
    first = bundled_samples()["green_field.jpg"]
    image = harness.upload("in/cached.jpg", first.read_bytes())
    size = len(first.read_bytes())
    before = input_figures(harness)
    n = 6
    for done in run_all(harness, image, n):
        assert done["status"] == "COMPLETED", done["error"]
        assert_result_is_the_pipelines(harness, done, first)  # as without the cache

    def grew(name: str) -> float:
        return input_figures(harness).get(name, 0.0) - before.get(name, 0.0)

    # The first task on the host fetched it; every other workflow copied it from the cache.
    assert grew("cdiflow_worker_input_s3_bytes") == size
    assert grew("cdiflow_worker_input_cache_misses") == 1
    assert grew("cdiflow_worker_input_cache_hits") == n - 1
    assert grew("cdiflow_worker_input_cache_saved_bytes") == (n - 1) * size
    assert input_figures(harness)["cdiflow_worker_input_cache_entries"] == 1

    # The object changes in S3: the next workflows see the new one, fetched once more.
    second = bundled_samples()["blue_sky.jpg"]
    harness.upload("in/cached.jpg", second.read_bytes())
    for done in run_all(harness, image, 3):
        assert done["status"] == "COMPLETED", done["error"]
        assert_result_is_the_pipelines(harness, done, second)
    assert grew("cdiflow_worker_input_cache_misses") == 2
    assert grew("cdiflow_worker_input_cache_hits") == n - 1 + 2
    assert grew("cdiflow_worker_input_s3_bytes") == size + len(second.read_bytes())
    # The old version's entry went: one entry, for the new one.
    figures = wait_for(
        lambda: (f := input_figures(harness))["cdiflow_worker_input_cache_entries"] == 1 and f,
        "the old entry to go",
    )
    assert figures["cdiflow_worker_input_cache_entries"] == 1
