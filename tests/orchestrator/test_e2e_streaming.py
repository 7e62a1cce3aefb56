"""Streaming steps end to end on a real stack (Postgres, Redis, S3, CDI controller and minion,
API, scheduler, two workers of two slots each): the bundled ``stream_numbers`` runs its three
steps at once with the items flowing over channels, two runs at once never see each other's
items, a definition with a broken stream is refused at the API, a worker killed under a
streaming step fails its run with a clear error instead of leaving it stuck, a cancel stops
every step, and a group wider than all the workers' slots fails its run saying so."""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest

import cdi
from orchestrator.stack import Stack
from orchestrator.stack.defaults import WORKER_COMMAND
from tests.orchestrator.test_e2e import Harness, free_port, wait_for

SLOTS = 2  # per worker: the three steps of a group fit on the two workers


@pytest.fixture(scope="module")
def harness() -> Iterator[Harness]:
    folder = tempfile.mkdtemp(prefix="cdiflow-streaming-")
    os.chmod(folder, 0o755)
    worker = (*WORKER_COMMAND, "--concurrency", str(SLOTS))
    try:
        with Stack(folder, workers=2, port=free_port(), worker_command=worker) as stack:
            h = Harness(stack)
            yield h
            h.api.close()
            with cdi.Client(stack.minion_socket) as probe:  # every ring and cursor freed
                wait_for(
                    lambda: (
                        not [
                            k
                            for o in probe.list_objects()
                            if (k := o["key"]) >= "channel/" and k.startswith("channel/")
                        ]
                    ),
                    "the minion to hold no channel",
                    timeout=30,
                )
    finally:
        subprocess.run(["rm", "-rf", folder], check=False)


def _channels(probe: cdi.Client) -> list[str]:
    return [o["key"] for o in probe.list_objects() if o["key"].startswith("channel/")]


def _start(
    harness: Harness, data: dict[str, Any], workflow: str = "stream_numbers", **extra: Any
) -> str:
    body = {"workflow": workflow, "input": {"data": data}, **extra}
    reply = harness.api.post("/api/workflows", json=body)
    assert reply.status_code == 201, reply.text
    started: str = reply.json()["id"]
    return started


def _window(run: dict[str, Any], ref: str) -> tuple[float, float]:
    [task] = [t for t in run["task_runs"] if t["ref"] == ref]
    return (
        datetime.fromisoformat(task["started_at"]).timestamp(),
        datetime.fromisoformat(task["finished_at"]).timestamp(),
    )


def test_a_streaming_group_runs_at_once_and_totals_every_item(harness: Harness) -> None:
    count = 2000
    runs = [_start(harness, {"count": count}), _start(harness, {"count": count // 2})]
    first, second = (harness.wait(r) for r in runs)
    for done, n in ((first, count), (second, count // 2)):
        assert done["status"] == "COMPLETED", done["error"]
        by_ref = {t["ref"]: t for t in done["task_runs"]}
        assert by_ref["count"]["output"] == {"sent": n}
        assert by_ref["double"]["output"] == {"doubled": n}
        # Each run saw its own items only: the sum of 2 * (1..n).
        assert by_ref["total"]["output"] == {"total": n * (n + 1), "count": n}
    # The three steps overlapped in time: none waited for another's end.
    windows = [_window(first, ref) for ref in ("count", "double", "total")]
    assert max(start for start, _ in windows) < min(end for _, end in windows)


def test_a_definition_whose_channel_has_no_publisher_is_refused(harness: Harness) -> None:
    body = {
        "name": "stream_broken_def",
        "tasks": [
            {"ref": "a", "task": "stream_count", "channels": {"publish": ["numbers"]}},
            {"ref": "b", "task": "stream_total",
             "channels": {"subscribe": ["numbers", "doubled"]}, "depends_on": ["a"]},
        ],
    }  # fmt: skip
    reply = harness.api.post("/api/workflow-definitions", json=body)
    assert reply.status_code == 422, reply.text
    text = reply.text
    assert "channel 'doubled'" in text and "no step publishes it" in text
    # b may not wait for a's end: the steps joined by a channel run at the same time.
    assert "step 'b': waits for 'a' to end" in text and "streaming group" in text


def test_a_worker_killed_under_a_streaming_step_fails_the_run_clearly(harness: Harness) -> None:
    run = _start(harness, {"count": 100_000, "pause_ms": 1})

    def running_double() -> str | None:
        tasks = harness.get(run)["task_runs"]
        refs = {t["ref"]: t for t in tasks if t["status"] == "QUEUED"}  # out at a worker
        if {"count", "double", "total"} <= refs.keys():
            worker: str = refs["double"]["worker_id"]
            return worker
        return None

    victim = wait_for(running_double, "the group to run", timeout=60)
    time.sleep(1.5)  # joined, and items are flowing
    harness.stack.kill_worker(victim)
    done = harness.wait(run, timeout=120)
    assert done["status"] == "FAILED"
    error = done["error"]
    assert "'numbers'" in error or "'doubled'" in error or "cannot run again" in error, error
    # No step is left out at a worker.
    # Nothing is left out at a worker: the live peer is stopped, the killed one given up.
    settled = wait_for(
        lambda: (
            (d := harness.get(run)) and all(t["status"] != "QUEUED" for t in d["task_runs"]) and d
        ),
        "every step of the failed run to end",
        timeout=60,
    )
    states = {t["ref"]: t["status"] for t in settled["task_runs"]}
    assert states["double"] in ("FAILED", "CANCELLED"), states


def test_a_cancelled_streaming_run_stops_every_step(harness: Harness) -> None:
    run = _start(harness, {"count": 100_000, "pause_ms": 1})
    wait_for(lambda: _out(harness, run) >= {"count", "double", "total"}, "the group to run")
    time.sleep(1.0)
    reply = harness.api.post(f"/api/workflows/{run}/cancel")
    assert reply.status_code == 200, reply.text
    done = harness.wait(run, timeout=60)
    assert done["status"] == "CANCELLED", done["error"]
    states = wait_for(lambda: _settled(harness, run), "every step to stop", timeout=30)
    # Stopped, or failed by a stream its stopped publisher broke: none ran to its end.
    assert "CANCELLED" in states.values() and "COMPLETED" not in states.values(), states


def test_a_streaming_run_past_its_time_limit_ends_timed_out_with_every_step_stopped(
    harness: Harness,
) -> None:
    run = _start(harness, {"count": 100_000, "pause_ms": 1}, timeout_s=4)
    done = harness.wait(run, timeout=60)
    assert done["status"] == "TIMED_OUT", done["error"]
    states = wait_for(lambda: _settled(harness, run), "every step to stop", timeout=30)
    # Stopped, or failed by a stream its stopped publisher broke: none ran to its end.
    assert "COMPLETED" not in states.values(), states


def test_a_group_larger_than_every_slot_fails_its_run_saying_so(harness: Harness) -> None:
    readers = [
        {"ref": f"total{i}", "task": "stream_total", "params": {"from": "numbers"},
         "channels": {"subscribe": ["numbers"]}}
        for i in range(2 * SLOTS)
    ]  # fmt: skip
    body = {
        "name": "stream_too_wide",
        "worker_wait_s": 2,
        "tasks": [{"ref": "count", "task": "stream_count", "channels": {"publish": ["numbers"]}},
                  *readers],
    }  # fmt: skip
    reply = harness.api.post("/api/workflow-definitions", json=body)
    assert reply.status_code == 201, reply.text
    done = harness.wait(_start(harness, {"count": 10}, "stream_too_wide"), timeout=60)
    assert done["status"] == "FAILED"
    assert "the live workers have 4 slot(s) in all" in done["error"], done["error"]
    assert all(t["ref"] == "input" for t in done["task_runs"]), done["task_runs"]


def _settled(harness: Harness, run: str) -> dict[str, str] | None:
    """Each step's status once none of ``run``'s steps is out at a worker."""
    states = {t["ref"]: t["status"] for t in harness.get(run)["task_runs"] if t["ref"] != "input"}
    return None if "QUEUED" in states.values() else states


def _out(harness: Harness, run: str) -> set[str]:
    """The steps of ``run`` out at a worker now."""
    return {t["ref"] for t in harness.get(run)["task_runs"] if t["status"] == "QUEUED"}
