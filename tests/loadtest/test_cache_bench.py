"""``cdiflow bench cache`` at a tiny size on the session's services: both systems run, every
workflow completes, and the S3 bytes are what the cache promises (asserts no timings)."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadtest.cache_bench import cache_table, measure_cache
from orchestrator.services import RunningServices


@pytest.mark.timeout(300)
def test_the_cache_fetches_each_input_once_and_no_cache_every_time(
    service_stack: RunningServices, tmp_path: Path
) -> None:
    result = measure_cache(tmp_path, size=20_000, inputs=2, per_input=3, workers=2,
                           task="classify", budget_mib=64, rounds=1, services=service_stack,
                           redis_db=14)  # fmt: skip
    rows = {r["system"]: r for r in result["rows"]}
    assert set(rows) == {"cache", "no-cache"}
    distinct = result["distinct_input_bytes"]
    assert rows["no-cache"]["s3_bytes_fetched"] == 3 * distinct
    assert rows["cache"]["s3_bytes_fetched"] == distinct
    assert (rows["cache"]["cache_hits"], rows["cache"]["cache_misses"]) == (4, 2)
    assert all(r["workflows"] == 6 and r["throughput_wps"] > 0 for r in rows.values())
    assert result["s3_bytes_over_distinct"] == 1.0
    assert "no-cache" in cache_table(result)
