"""What operators read: Prometheus metrics of the API and of the workers, parsed with the
Prometheus text parser, and JSON logs whose lines about a run carry its ids."""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from cdiflow.client import Client
from tests.client.conftest import StackApi


def _samples(text: str) -> dict[str, list[Sample]]:
    """Every sample of a scrape by metric family (the parser refuses malformed text)."""
    return {family.name: list(family.samples) for family in text_string_to_metric_families(text)}


def _value(samples: Iterable[Sample], name: str, **labels: str) -> float:
    [sample] = [s for s in samples if s.name == name and labels.items() <= s.labels.items()]
    return sample.value


def test_the_api_metrics_describe_runs_tasks_workers_and_cdi(
    api: Client, stack_api: StackApi, photo: Path
) -> None:
    done = api.run("image_pipeline", photo, policy="transfer", timeout=120)
    with httpx.Client(base_url=stack_api.url, timeout=30) as http:
        assert http.get("/metrics").status_code == 401  # Prometheus sends a key, as here
        scraped = http.get("/metrics", headers=stack_api.headers())
    assert scraped.status_code == 200 and scraped.headers["content-type"].startswith("text/plain")
    families = _samples(scraped.text)

    for source in ("postgres", "redis", "cdi"):
        assert _value(families["cdiflow_source_up"], "cdiflow_source_up", source=source) == 1
    # Runs by status and by workflow (the definition's name).
    completed = _value(families["cdiflow_workflows"], "cdiflow_workflows", status="COMPLETED",
                       workflow="image_pipeline")  # fmt: skip
    assert completed >= 1
    every = sum(s.value for s in families["cdiflow_workflows"] if s.labels["status"] == "COMPLETED")
    assert every >= completed
    assert _value(families["cdiflow_task_runs"], "cdiflow_task_runs", status="COMPLETED") >= 3
    latency = families["cdiflow_workflow_duration_seconds"]
    count = _value(latency, "cdiflow_workflow_duration_seconds_count", workflow="image_pipeline")
    assert count == completed  # every completed run of the workflow, in its histogram
    buckets = [
        s.value
        for s in latency
        if s.name.endswith("_bucket") and s.labels["workflow"] == "image_pipeline"
    ]
    assert buckets == sorted(buckets) and buckets[-1] == count  # cumulative, +Inf = count
    took = (done.finished_at - done.created_at).total_seconds() if done.finished_at else 0
    # The sum is kept in float milliseconds: equal to the run's own duration within 1 µs.
    assert _value(latency, "cdiflow_workflow_duration_seconds_sum",
                  workflow="image_pipeline") >= took - 1e-6  # fmt: skip
    assert _value(families["cdiflow_api_long_polls"], "cdiflow_api_long_polls") >= 0
    runs = families["cdiflow_task_run_duration_seconds"]
    assert _value(runs, "cdiflow_task_run_duration_seconds_count", task="deblur") >= 1
    assert "cdiflow_task_queue_wait_seconds" in families
    assert _value(families["cdiflow_handoffs"], "cdiflow_handoffs_total") >= len(done.handoffs)
    # A chain's object may stay on its worker all along (no hand-off): the bytes counted are
    # at least this run's, and some whenever a hand-off was counted.
    moved = _value(families["cdiflow_handoff_bytes"], "cdiflow_handoff_bytes_total")
    assert moved >= sum(h.bytes for h in done.handoffs)
    assert (moved > 0) == (_value(families["cdiflow_handoffs"], "cdiflow_handoffs_total") > 0)

    for worker_id in stack_api.stack.worker_ids:
        assert _value(families["cdiflow_worker_up"], "cdiflow_worker_up", worker=worker_id) == 1
        rss = families["cdiflow_worker_resident_memory_bytes"]
        assert _value(rss, "cdiflow_worker_resident_memory_bytes", worker=worker_id) > 2**20
        assert _value(families["cdiflow_worker_queue_depth"], "cdiflow_worker_queue_depth",
                      worker=worker_id) >= 0  # fmt: skip
    objects = families["cdiflow_cdi_objects"]
    assert objects and all(s.value >= 0 for s in objects)
    assert families["cdiflow_cdi_minion_up"][0].value == 1
    assert _value(families["process_resident_memory_bytes"], "process_resident_memory_bytes") > 0


def test_each_worker_serves_its_own_metrics(api: Client, stack_api: StackApi) -> None:
    api.run("noop_pipeline", timeout=60)  # dataless: a task on some worker
    counted = 0.0
    for worker_id, url in stack_api.stack.worker_metrics.items():
        families = _samples(httpx.get(url, timeout=10).text)
        # The process's own figures (a body forked a moment ago may not have used a clock tick
        # of CPU yet, so its CPU counter may read 0; its start time never does).
        assert _value(families["process_cpu_seconds"], "process_cpu_seconds_total") >= 0, worker_id
        assert _value(families["process_start_time_seconds"], "process_start_time_seconds") > 0
        assert "cdiflow_worker_running_tasks" in families
        counted += sum(s.value for s in families.get("cdiflow_worker_tasks", [])
                       if s.name == "cdiflow_worker_tasks_total")  # fmt: skip
    assert counted >= 3  # the noop pipeline's three tasks, at least


def test_json_logs_carry_the_run_and_task_ids(api: Client, stack_api: StackApi) -> None:
    done = api.run("noop_pipeline", timeout=60)
    run_id = str(done.id)
    lines = []
    ours = {"api", stack_api.stack.scheduler_id, *stack_api.stack.worker_ids}  # not the services
    for log in (stack_api.stack.logs_dir).glob("*.log"):
        if log.stem in ours:
            # Every line is JSON: the stack's line at each start too.
            lines += [(log.name, json.loads(line)) for line in log.read_text().splitlines()]
    assert lines and all({"time", "level", "logger", "message", "process"} <= line.keys()
                         for _name, line in lines)  # fmt: skip
    started = [line for _name, line in lines if line["message"].startswith("cdiflow starts:")]
    assert {line["process"] for line in started} == ours
    for _name, line in lines:  # ISO 8601, with the offset
        assert datetime.fromisoformat(line["time"]).utcoffset() is not None, line
    about = [(name, line) for name, line in lines if line.get("workflow_id") == run_id]
    # Each worker line about the run names its task run and step: one per task run at least.
    on_workers = [line for name, line in about if name.startswith("worker-")]
    assert {line["step"] for line in on_workers} == {"noop1", "noop2", "noop3"}, on_workers
    assert all(isinstance(line["task_run_id"], int) for line in on_workers)
    assert {line["task_run_id"] for line in on_workers} == {r.id for r in done.task_runs}
    # The API's access lines name the run their path is about.
    api_lines = [line for name, line in about if name == "api.log"]
    assert api_lines and all(line["process"] == "api" for line in api_lines), api_lines
