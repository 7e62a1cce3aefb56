"""A tiny run of every system that is cheap to start: the harness works end to end.

Real stacks, real Celery workers, real locust processes, on the test session's services.
Asserts completion and well-formed results, never timings. Redis logical databases 1-5 are
this module's (the stack tests use 0 and 10-13, the API tests 9).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import psutil
import pytest

from loadtest.idle import idle_table, measure_idle
from loadtest.quick import run_quick
from loadtest.quick_graphs import FAN_SIZES, FORK_WIDTHS
from loadtest.report import (
    graphs_goals,
    graphs_table,
    quick_goals,
    quick_table,
    resources_table,
    scenario_table,
)
from loadtest.runner import BenchConfig, run_benchmark
from loadtest.systems.services import s3_client
from orchestrator.services import RunningServices
from tests.loadtest.conftest import require

SYSTEMS = ("floor", "floor-s3", "transfer", "object-store", "celery")
RESULT_FIELDS = {
    "system",
    "scenario",
    "size",
    "tasks",
    "concurrency",
    "completed",
    "failed",
    "mean_latency_s",
    "p50_latency_s",
    "throughput_wps",
}


def _listed(services: RunningServices, prefix: str) -> list[str]:
    s3 = s3_client(services)
    page = s3.list_objects_v2(Bucket=services.s3_bucket, Prefix=prefix)
    return [o["Key"] for o in page.get("Contents", [])]


def _descendants() -> set[int]:
    """This process's descendants, but for multiprocessing's resource tracker: the floor's
    spawned pool starts it, and it lives, by design, as long as this interpreter."""
    out = set()
    for proc in psutil.Process().children(recursive=True):
        try:
            if "multiprocessing.resource_tracker" not in " ".join(proc.cmdline()):
                out.add(proc.pid)
        except psutil.NoSuchProcess:
            continue
    return out


@pytest.mark.timeout(600)
def test_every_cheap_system_completes_a_tiny_scenario_run(
    service_stack: RunningServices, short_dir: Path
) -> None:
    require("locust", "celery")
    before = _descendants()
    config = BenchConfig(
        scenarios=("1",),
        systems=SYSTEMS,
        sizes=(10_000,),
        parallel=2,
        min_workflows=2,
        data_dir=short_dir,
        time_limit_s=240,
        loads=(0.5,),
    )
    report = run_benchmark(config, services=service_stack, redis_db_from=1)
    every = report.as_dict()["results"]
    json.dumps(report.as_dict())  # the --json payload serialises
    # Each system's closed-loop point, then the same point as an open loop at half its pace.
    assert [(r["system"], r["load"]) for r in every] == [
        (s, x) for s in SYSTEMS for x in (None, 0.5)
    ]
    for closed, opened in zip(every[::2], every[1::2], strict=True):
        assert opened["arrival_rate_wps"] == pytest.approx(0.5 * closed["throughput_wps"], 0.01)
        assert (opened["completed"], opened["failed"]) == (2, 0), opened
    rows = every[::2]
    # Every system's results were read back and are the reference's pixels (the floor stores
    # none), and every client noticed each end.
    for row in every:
        assert row["verified"]["ok"], row["verified"]
        assert row["notice_p50_ms"] is not None and row["notice_p50_ms"] >= 0, row
        if row["system"] != "floor":
            assert row["verified"]["matched"] == row["completed"] == 2, row["verified"]
    assert [r["system"] for r in rows] == list(SYSTEMS)
    for row in rows:
        assert row.keys() >= RESULT_FIELDS
        assert (row["completed"], row["failed"]) == (2, 0), row
        assert row["p50_latency_s"] > 0 and math.isfinite(row["throughput_wps"])
    assert all(r["throughput_vs_floor"] is not None for r in rows if r["system"] != "floor")
    assert "celery" in scenario_table(report.results)
    # Every point says what each component used; each system's own processes are among them.
    for row in rows:
        assert row["resources"], row["system"]
        assert all(c["cpu_s"] >= 0 and c["peak_rss_mib"] > 0 for c in row["resources"].values())
        assert all(
            0 <= c["sys_ms_per_workflow"] <= c["cpu_ms_per_workflow"] + 1  # rounding
            and c["page_faults_per_workflow"] >= 0
            for c in row["resources"].values()
        )
    # Workers that map and write images fault pages in: the count is read, not left at zero.
    assert used_faults(rows, "transfer", "cdiflow workers") > 0
    used = {r["system"]: r["resources"] for r in rows}
    assert "cdiflow scheduler" in used["transfer"] and "cdi minion" in used["transfer"]
    assert "celery workers" in used["celery"]
    # locust exits before the meter's end; what it measured of itself is in its component.
    for system in ("transfer", "celery"):
        assert used[system]["locust (clients)"]["cpu_s"] > 0, used[system]
    assert "locust (clients)" not in used["floor"]
    # floor-s3 runs in its own pool (two workflows are too little CPU to read: 10 ms ticks),
    # and leaves no result behind in S3.
    assert "floor workers" in used["floor-s3"], used["floor-s3"]
    assert not _listed(service_stack, "floor-s3/")
    # The table has a row per system, busiest components first (which five lead a two-workflow
    # point varies, so only that cdiflow's own processes are among them is checked).
    table = {line.split()[0]: line for line in resources_table(report.results).splitlines()[1:]}
    assert list(table) == list(SYSTEMS) and "cdiflow " in table["transfer"], table
    # cdiflow's workers say how much of the window they ran tasks; the peers record nothing.
    busy = {r["system"]: r["workers_busy"] for r in rows}
    assert set(busy["transfer"]) <= {"worker-1", "worker-2"} and busy["transfer"], busy
    assert all(0 < share <= 1 for share in busy["transfer"].values())
    assert busy["celery"] == {} and busy["floor"] == {}
    # Every system reports its image operations' own CPU (cdiflow from its task runs, the
    # others from their tasks' results), and the table splits each point's CPU by it.
    ops = {r["system"]: r["ops_cpu_ms_per_workflow"] for r in rows}
    assert all(ops[s] > 0 for s in SYSTEMS), ops
    assert all("(operations " in table[s] and "around them" in table[s] for s in SYSTEMS), table
    assert _descendants() <= before, "the benchmark left processes behind"


@pytest.mark.timeout(300)
def test_quick_measures_each_policy_on_one_stack(
    service_stack: RunningServices, short_dir: Path
) -> None:
    before = _descendants()
    report = run_quick(
        repeat=2,
        burst=2,
        warmup=1,
        systems=("affinity", "object-store"),
        data_dir=short_dir,
        services=service_stack,
        redis_db_from=5,
        tile_bytes=200_000,
    )
    rows = report.rows
    assert [(r.system, r.workflow) for r in rows] == [
        ("affinity", "noop_pipeline"),
        ("object-store", "noop_pipeline"),
        ("affinity", "image_pipeline"),
        ("object-store", "image_pipeline"),
    ]
    for r in rows:
        assert r.n == 2 and r.burst_completed == 2 and r.tasks == 3
        assert set(r.phases_p50_ms) == {"admit", "input", "dispatch", "run", "report", "output"}
        # The dataless no-op rows carry the 1- and 10-task chains; image rows none.
        dataless = r.workflow == "noop_pipeline"
        assert set(r.chain_p50_ms) == ({1, 10} if dataless else set())
        assert (r.marginal_ms_per_task is not None) == dataless
        assert all(ms > 0 for ms in r.chain_p50_ms.values())
    assert "noop_pipeline" in quick_table(rows)
    assert "the marginal cost of a task" in quick_goals(rows)
    # Graphs run on the CDI planes only: one fork/join and fan-out row, one tiled fan-out row.
    [graph] = report.graphs
    assert graph.system == "affinity" and graph.n == 2
    assert list(graph.fork_join_p50_ms) == list(FORK_WIDTHS)
    assert list(graph.fan_out_p50_ms) == list(FAN_SIZES)
    assert all(ms > 0 for ms in [*graph.fork_join_p50_ms.values(), *graph.fan_out_p50_ms.values()])
    assert set(graph.per_element_ms) == {16, 256}
    one = graph.fan_out_p50_ms[1]
    assert graph.per_element_ms[256] == round((graph.fan_out_p50_ms[256] - one) / 255, 3)
    [tiled] = report.tiles
    assert (tiled.system, tiled.tiles, tiled.workers, tiled.n) == ("affinity", 16, 2, 2)
    assert 0 < tiled.fan_out_p50_ms < tiled.latency_p50_ms and tiled.tile_run_p50_ms > 0
    assert tiled.floor_p50_ms > 0 and tiled.pixels > 0
    assert tiled.share_of_floor == pytest.approx(
        tiled.floor_p50_ms / tiled.fan_out_p50_ms, rel=0.01
    )
    assert set(report.as_dict()) == {"results", "graphs", "tiles"}
    assert "per branch" in graphs_table(report.graphs, report.tiles)
    goals = graphs_goals(report.graphs, report.tiles)
    assert "per extra branch" in goals and "process pool's floor" in goals
    assert _descendants() <= before


def used_faults(rows: list[dict[str, Any]], system: str, component: str) -> float:
    row = next(r for r in rows if r["system"] == system)
    faults: float = row["resources"][component]["page_faults_per_workflow"]
    return faults


@pytest.mark.timeout(300)
def test_idle_meters_every_process_of_a_waiting_stack(
    service_stack: RunningServices, short_dir: Path
) -> None:
    before = _descendants()
    result = measure_idle(short_dir, 2.0, 0.0, 2, services=service_stack, redis_db=12)
    used = result["components"]
    assert {"cdiflow scheduler", "cdiflow workers", "cdiflow api", "cdi minion"} <= set(used)
    assert all(c["cpu_ms_per_s"] >= c["sys_ms_per_s"] >= 0 for c in used.values()), used
    assert all(c["peak_rss_mib"] > 0 for c in used.values()), used
    total = sum(c["cpu_ms_per_s"] for c in used.values())
    assert result["total_cpu_ms_per_s"] == pytest.approx(total, abs=0.05)
    assert result["machine"]["cpus"] == os.cpu_count() and len(result["machine"]["loadavg"]) == 3
    assert "cdiflow scheduler" in idle_table(result) and "(load " in idle_table(result)
    assert _descendants() <= before, "the idle stack was left running"
