"""The load test's bookkeeping: scenario points, pipelines, summaries, floor comparison, CLI."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from cdiflow.cli import main
from loadtest.arrivals import Arrivals
from loadtest.cdiflow_api import while_busy
from loadtest.cli import bench_workflows_command
from loadtest.image_costs import bench_images_command, measure_image_costs
from loadtest.images import chain_definition, chain_ops, chain_workflow, make_jpeg
from loadtest.plan import Point, Target, plan_points, poll_max_s
from loadtest.plots import write_plots
from loadtest.resources import ExitedUsage, ResourceMeter, component_of
from loadtest.runner import compare_to_floor, median_over_rounds
from loadtest.stats import (
    PointResult,
    WorkflowRecord,
    busy_shares,
    percentile,
    summarize_point,
    window,
)
from orchestrator.stack.state import DataDirLock
from tests.loadtest.conftest import require
from workflows.definitions import bundled_task_definitions, parse_workflow


def test_scenarios_plan_the_points_of_the_issue() -> None:
    one = plan_points("1", min_workflows=30)
    assert [(p.size, p.tasks, p.concurrency, p.workflows) for p in one] == [
        (10_000, 3, 10, 30),
        (100_000, 3, 10, 30),
        (500_000, 3, 10, 30),
        (2_000_000, 3, 10, 30),
    ]
    two = plan_points("2", min_workflows=30)
    assert [p.concurrency for p in two] == [1, 50, 100, 200, 500]
    assert all(p.size is None and min(p.sizes) == 10_000 and max(p.sizes) == 4_000_000 for p in two)
    assert [p.workflows for p in two] == [30, 50, 100, 200, 500]
    three = plan_points("3", min_workflows=30)
    assert [(p.tasks, p.size) for p in three] == [
        (1, 2_000_000),
        (3, 2_000_000),
        (6, 2_000_000),
        (10, 2_000_000),
    ]
    with pytest.raises(ValueError, match="unknown scenario"):
        plan_points("4")


def test_pipelines_cycle_the_three_operations_and_are_valid_definitions() -> None:
    assert chain_ops(1) == ["deblur"]
    assert chain_ops(3) == ["deblur", "denoise", "classify"]
    assert chain_ops(10)[-1] == "deblur" and len(chain_ops(10)) == 10
    assert chain_workflow(3) == "image_pipeline"
    tasks = [t["name"] for t in bundled_task_definitions()]
    for n in (1, 6, 10):
        definition = parse_workflow(chain_definition(n), tasks)
        assert [s.task for s in definition.tasks] == chain_ops(n)
        assert definition.order() == [s.ref for s in definition.tasks]  # a straight chain


def test_sized_images_land_near_their_target() -> None:
    data = make_jpeg(20_000)
    assert data[:2] == b"\xff\xd8"  # a JPEG
    assert abs(len(data) / 20_000 - 1) <= 0.15


def test_polling_stays_gentle_with_many_users() -> None:
    assert poll_max_s(1) == 1.0
    assert poll_max_s(500) * 100 >= 500  # at most ~100 polls a second from the crowd


def _record(submitted: float, stored: float | None, status: str = "COMPLETED") -> WorkflowRecord:
    return WorkflowRecord("transfer", 10_000, 3, submitted, stored, status)


def test_point_summary_counts_failures_and_measures_from_first_start_to_last_store() -> None:
    records = [
        _record(100.0, 101.0),
        _record(100.5, 102.0),
        _record(100.3, 101.5),
        _record(100.2, None, "FAILED"),
        WorkflowRecord("transfer", 0, 3, 0.0, None, "MISSING", "locust died"),
    ]
    result = summarize_point(
        records,
        system="transfer",
        scenario="1",
        size=10_000,
        tasks=3,
        concurrency=2,
        link="loopback",
    )
    assert (result.completed, result.failed) == (3, 2)
    assert result.p50_latency_s == 1.2 and result.p99_latency_s == 1.5
    assert result.throughput_wps == round(3 / 2.0, 3)
    assert result.errors == ["locust died"]
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.0


def test_results_are_set_against_the_floor_of_the_same_point() -> None:
    def row(system: str, p50: float, tput: float, size: int = 10_000) -> PointResult:
        return PointResult(system, "1", size, 3, 10, 10, 0, p50, p50, p50, tput)

    out = compare_to_floor(
        [row("floor", 0.1, 20.0), row("celery", 0.4, 5.0), row("affinity", 0.3, 10.0, size=99)]
    )
    assert out[0].overhead_p50_s is None
    assert out[1].overhead_p50_s == pytest.approx(0.3) and out[1].throughput_vs_floor == 0.25
    assert out[2].overhead_p50_s is None  # no floor at that size


def test_rounds_are_set_against_their_own_floor_and_summarised_by_median() -> None:
    def row(system: str, round_no: int, tput: float, failed: int = 0) -> PointResult:
        return PointResult(
            system, "1", 2_000_000, 3, 10, 10, failed, 1.0, 1.0, 1.0, tput, round=round_no,
            ops_cpu_ms_per_workflow=100 * tput,
        )  # fmt: skip

    out = compare_to_floor(
        [
            row("floor", 1, 2.0),
            row("affinity", 1, 1.8),
            row("floor", 2, 3.0),
            row("affinity", 2, 2.4, failed=1),
            row("floor", 3, 2.5),
            row("affinity", 3, 1.5),
        ]
    )
    shares = [r.throughput_vs_floor for r in out if r.system == "affinity"]
    assert shares == [0.9, 0.8, 0.6]  # each against its own round's floor, not the first
    medians = {r.system: r for r in median_over_rounds(out)}
    assert medians["affinity"].throughput_vs_floor == 0.8
    assert medians["affinity"].throughput_wps == 1.8
    assert (medians["affinity"].round, medians["affinity"].failed) == (3, 1)
    assert medians["floor"].throughput_vs_floor is None
    assert medians["affinity"].ops_cpu_ms_per_workflow == 180  # the median, not round 1's


def test_target_round_trips_through_its_json_file(tmp_path: Path) -> None:
    target = Target("celery", [("s3://cdiflow/a.jpg", 10_000)], 3, 2, 1, str(tmp_path / "r"))
    target.write(tmp_path / "t.json")
    assert Target.read(tmp_path / "t.json") == target


def test_plots_are_written_for_each_scenario_present(tmp_path: Path) -> None:
    require("matplotlib")
    rows = [
        PointResult(s, "1", size, 3, 10, 10, 0, 0.5, 0.6, 0.5, 2.0).as_dict()
        for s in ("floor", "affinity")
        for size in (10_000, 100_000)
    ]
    paths = write_plots(rows, tmp_path)
    assert [p.name for p in paths] == ["scenario1-loopback.png"]
    assert paths[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "either --quick or --scenario"),
        (["--quick", "--scenario", "1"], "either --quick or --scenario"),
        (["--scenario", "1", "--systems", "floor,nope"], "unknown system"),
        (["--scenario", "1", "--sizes", "10XB"], "cannot read"),
        (["--scenario", "2", "--concurrency", "0"], "each 1 or more"),
        (["--quick", "--systems", "celery"], "--quick measures"),
        (["--scenario", "1", "--open-loop", "half"], "shares such as"),
        (["--scenario", "1", "--open-loop", "0.5,0"], "each above 0"),
        (["--scenario", "1", "--intermediate", "gif"], "'gif' is not one of"),
    ],
)
def test_the_command_refuses_bad_options_before_starting_anything(
    args: list[str], message: str
) -> None:
    result = CliRunner().invoke(bench_workflows_command, args)
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_a_point_point_label_names_its_configuration() -> None:
    assert Point("2", (1, 2), 3, 50, 1).label() == "s2 mixed x3 c50"
    assert json.dumps(Point("1", (10_000,), 3, 10, 3).label()) == '"s1 10KB x3 c10"'
    assert Point("1", (10_000,), 3, 10, 3, arrival_rate=12.5).label() == "s1 10KB x3 r12.5"


def test_a_closed_loop_starts_each_users_next_workflow_when_its_last_ends() -> None:
    arrivals = Arrivals(3, 2, 0.0, seed=1)
    assert arrivals.initial() == [0, 1, 2] and arrivals.due_in() is None
    for user in arrivals.initial():
        arrivals.take(user)
    assert arrivals.again(1)
    arrivals.take(1)
    assert not arrivals.again(1) and arrivals.again(0)
    # Users draw as locust's users draw: the same generator per user and seed.
    assert arrivals.rngs[2].random() == Arrivals(3, 2, 0.0, seed=1).rngs[2].random()


def test_an_open_loop_starts_workflows_at_its_rate_whatever_ends() -> None:
    arrivals = Arrivals(1, 3, 10.0, seed=1)
    assert arrivals.initial() == []
    due = arrivals.due_in()
    assert due is not None and due <= 0  # the first start is due at once
    arrivals.take(0)
    due = arrivals.due_in()
    assert due is not None and 0.05 < due <= 0.1  # the next 1 / rate after the first
    assert not arrivals.again(0)  # an end starts nothing in an open loop
    arrivals.take(0)
    arrivals.take(0)
    assert arrivals.due_in() is None  # all three started


def test_the_time_a_client_took_to_notice_is_summarised() -> None:
    records = [
        WorkflowRecord("celery", 10_000, 3, 100.0, 101.0, "COMPLETED", noticed_at=101.002),
        WorkflowRecord("celery", 10_000, 3, 100.0, 102.0, "COMPLETED", noticed_at=102.004),
        WorkflowRecord("celery", 10_000, 3, 100.0, 101.5, "COMPLETED", noticed_at=101.503),
        WorkflowRecord("celery", 10_000, 3, 100.0, None, "FAILED"),
    ]
    assert records[0].notice_s == pytest.approx(0.002, abs=1e-9) and records[3].notice_s is None
    result = summarize_point(
        records, system="celery", scenario="1", size=10_000, tasks=3, concurrency=2,
        link="loopback",
    )  # fmt: skip
    assert result.notice_p50_ms == pytest.approx(3.0, abs=0.01)
    assert result.notice_mean_ms == pytest.approx(3.0, abs=0.01)
    assert result.p95_latency_s == 2.0


@pytest.mark.parametrize(
    ("cmdline", "component"),
    [
        ("/venv/bin/python -m orchestrator.scheduler --id scheduler-1", "cdiflow scheduler"),
        ("/venv/bin/python -m cdi.minion --socket /x/minion.sock", "cdi minion"),
        ("postgres: cdiflow bench_x 127.0.0.1(5000) idle", "postgres"),
        ("python -m celery -A loadtest.systems.celery_app worker", "celery workers"),
        ("java -Xmx768m -jar /d/conductor-server-3.32.3-boot.jar", "conductor server"),
        (
            "java -jar /d/conductor-server-3.32.3-boot.jar --conductor.db.type=postgres "
            "--spring.datasource.url=jdbc:postgresql://127.0.0.1:5432/x",
            "conductor server",
        ),
        ("/d/temporal server start-dev --headless --db-filename=/t/temporal.db", "temporal server"),
        ("python -m loadtest.systems.temporal_worker 127.0.0.1:7233", "temporal workers"),
        ("ray::_step", "ray"),
        ("python -m locust -f loadtest/locustfile.py --headless", "locust (clients)"),
        # The benchmark's own command line names systems; it must not be taken for them.
        ("cdiflow bench workflows --systems floor,celery,ray,conductor", None),
        ("python -c from multiprocessing.spawn import spawn_main", None),
    ],
)
def test_processes_are_put_in_their_component(cmdline: str, component: str | None) -> None:
    assert component_of(cmdline) == component


def test_bench_images_measures_every_step() -> None:
    result = measure_image_costs(20_000, 1)
    assert result["input_bytes"] > 10_000 and result["width"] * result["height"] > 0
    assert set(result["ms"]) >= {
        "decode jpeg",
        "encode png level 1",
        "read from cdi buffer (copy)",
        "map cdi buffer (a task's input)",
    }
    assert all(ms > 0 for ms in result["ms"].values())
    assert result["encoded_bytes"]["jpeg"] < result["encoded_bytes"]["png level 1"]
    shown = CliRunner().invoke(bench_images_command, ["--size", "20KB", "--repeat", "1"])
    assert shown.exit_code == 0, shown.output
    assert "encode png level 6" in shown.output


def test_busy_shares_count_each_workers_covered_time_once_within_the_window() -> None:
    runs = [
        ("w1", 0.0, 4.0),  # starts before the window: only 2..4 counts
        ("w1", 3.0, 5.0),  # overlaps the previous run (a second slot): 4..5 more
        ("w1", 8.0, 20.0),  # runs past the window: 8..12
        ("w2", 2.0, 3.0),
        ("w3", 13.0, 14.0),  # wholly outside
    ]
    assert busy_shares(runs, since=2.0, until=12.0) == {"w1": 0.7, "w2": 0.1}
    assert busy_shares(runs, since=5.0, until=5.0) == {}


def test_the_window_runs_from_first_submission_to_last_result() -> None:
    records = [
        WorkflowRecord("x", 1, 3, submitted_at=10.0, stored_at=12.5, status="COMPLETED"),
        WorkflowRecord("x", 1, 3, submitted_at=11.0, stored_at=None, status="FAILED"),
        WorkflowRecord("x", 1, 3, submitted_at=9.5, stored_at=14.0, status="COMPLETED"),
    ]
    assert window(records) == (9.5, 14.0)
    assert window(records[1:2]) is None


@pytest.mark.parametrize("mode", [["--scenario", "1"], ["--quick"]])
def test_a_second_run_on_the_same_folder_is_refused_with_the_first_ones_pid(
    tmp_path: Path, mode: list[str]
) -> None:
    first = DataDirLock(tmp_path, name="bench.lock")
    first.acquire()  # stands in for a run in progress: this process holds the folder
    try:
        args = ["bench", "workflows", *mode, "--systems", "affinity", "--data-dir", str(tmp_path)]
        result = CliRunner().invoke(main, args)  # as a user runs it: through `cdiflow`
    finally:
        first.release()
    assert result.exit_code == 1, result.output
    assert "another `cdiflow bench workflows` is running" in result.output
    assert f"(pid {os.getpid()})" in result.output
    assert "Traceback" not in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench.lock"]  # nothing started


def test_what_exited_processes_measured_of_themselves_joins_their_component() -> None:
    meter = ResourceMeter()
    meter.start()
    used = meter.stop(10, {"locust (clients)": ExitedUsage(0.5, 0.1, 64 << 20)})
    assert used["locust (clients)"]["cpu_ms_per_workflow"] == 50.0
    assert used["locust (clients)"]["sys_ms_per_workflow"] == 10.0
    assert used["locust (clients)"]["peak_rss_mib"] == 64.0
    assert "benchmark driver" in used  # the processes still there are measured as before


def test_rays_object_store_holds_the_images_a_point_keeps_in_flight(tmp_path: Path) -> None:
    import psutil
    from PIL import Image

    from loadtest.images import sized_images
    from loadtest.measure import in_flight_bytes
    from loadtest.systems.ray_sys import MIN_OBJECT_STORE_BYTES, object_store_bytes

    paths = sized_images(tmp_path, [10_000, 100_000])
    pixels = {}
    for size, path in paths.items():
        with Image.open(path) as img:
            pixels[size] = img.width * img.height * 3
    points = [Point("1", (10_000,), 3, 10, 1), Point("2", (10_000, 100_000), 3, 50, 1)]
    # The larger of 10 small images and 50 of the two sizes' mean.
    expected = max(10 * pixels[10_000], int(50 * (pixels[10_000] + pixels[100_000]) / 2))
    assert in_flight_bytes(points, paths) == expected
    assert object_store_bytes(0) == MIN_OBJECT_STORE_BYTES
    assert object_store_bytes(2**30) == int(1.5 * 2**30) + MIN_OBJECT_STORE_BYTES
    assert object_store_bytes(2**50) == psutil.virtual_memory().total // 2  # never above half


def test_ray_shares_its_cpus_over_hosts_as_cdiflow_its_workers() -> None:
    from loadtest.systems.ray_sys import _share

    assert _share(2, 1) == [2]
    assert _share(2, 2) == [1, 1]  # worker-1 on host 1, worker-2 on host 2
    assert _share(3, 2) == [2, 1]
    assert _share(1, 2) == [1, 0]  # no worker on host 2: no node there either


def test_an_open_loop_row_is_set_against_the_floors_latency_at_the_same_load() -> None:
    def row(system: str, p50: float, tput: float, load: float | None) -> PointResult:
        return PointResult(system, "1", 10_000, 3, 10, 10, 0, p50, p50, p50, tput, load=load)

    rows = compare_to_floor(
        [row("floor", 0.1, 50.0, None), row("floor", 0.05, 25.0, 0.5),
         row("affinity", 0.3, 20.0, None), row("affinity", 0.2, 10.0, 0.5)]
    )  # fmt: skip
    closed, opened = rows[2], rows[3]
    assert closed.throughput_vs_floor == 0.4 and closed.overhead_p50_s == 0.2
    assert opened.throughput_vs_floor is None and opened.overhead_p50_s == 0.15


def test_a_load_test_user_sends_a_429_again_after_retry_after() -> None:
    """At capacity the API answers 429 (and did nothing): the users wait and send it again."""

    @dataclass
    class Reply:
        status_code: int
        headers: dict[str, str]

    replies = iter([Reply(429, {"Retry-After": "0"}), Reply(429, {}), Reply(201, {})])
    sent: list[Reply] = []

    def send() -> Reply:
        sent.append(next(replies))
        return sent[-1]

    assert while_busy(send).status_code == 201
    assert [r.status_code for r in sent] == [429, 429, 201]
