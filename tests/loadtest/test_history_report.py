"""``cdiflow bench history``'s table says how much pruning delayed a running workflow, and
whether that meets the goal (judged at p95)."""

from __future__ import annotations

from typing import Any

import pytest

from loadtest.history.report import PRUNE_DELAY_GOAL_MS, history_table


def _report(delay_p95_ms: float) -> dict[str, Any]:
    spread = {"n": 200, "p50_ms": 40.0, "p95_ms": 50.0, "max_ms": 60.0}
    return {
        "histories": [{"workflows": 10_000, "task_runs_per_workflow": 3.2,
                       "events_per_workflow": 6.2, "handoffs_per_workflow": 1.0,
                       "statuses": {}, "grow_s": 1.0}],
        "results": [{"call": "new run", "workflows": 10_000, "p50_ms": 40.0, "ratio": 1.0}],
        "dashboard_tab": [], "plans": [],
        "machine": {"cpus": 2, "loadavg": [1.0], "loadavg_after": [1.0]},
        "prune": {"pruned": 1000, "seconds": 10.0, "runs_per_s": 100.0,
                  "new_run_before": spread, "new_run_during": spread,
                  "delay_p50_ms": 1.5, "delay_p95_ms": delay_p95_ms, "delay_max_ms": 30.0,
                  "delay_goal_ms": PRUNE_DELAY_GOAL_MS},
    }  # fmt: skip


@pytest.mark.parametrize(("p95", "verdict"), [(4.0, "met"), (PRUNE_DELAY_GOAL_MS + 1, "not met")])
def test_the_table_gives_pruning_s_delay_of_a_running_workflow_against_the_goal(
    p95: float, verdict: str
) -> None:
    line = next(x for x in history_table(_report(p95)).splitlines() if "delayed by" in x)
    assert f"p50 1.5 ms, p95 {p95} ms, max 30.0 ms" in line
    assert line.endswith(f"{verdict})")
