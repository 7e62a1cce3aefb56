"""``cdiflow bench ar-workflows`` on a few frames: both AR workflows run on one stack, every
frame comes out of each, and the table and ratio are there (asserts no timings)."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadtest.ar_workflows import ar_workflows_table, measure_ar_workflows


@pytest.mark.timeout(600)
def test_both_ar_workflows_run_side_by_side_on_the_same_workers(tmp_path: Path) -> None:
    result = measure_ar_workflows(tmp_path, frames=6, workers=2, slots=2, rounds=1)
    rows = {r["system"]: r for r in result["rows"]}
    assert set(rows) == {"ar_video", "ar_video_stream"}
    assert result["detectors_stream"] == 2
    assert all(r["fps"] > 0 and len(r["rounds_fps"]) == 1 for r in rows.values())
    assert result["stream_over_ar_video"] > 0
    assert "ar_video_stream / ar_video fps" in ar_workflows_table(result)
