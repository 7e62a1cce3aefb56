"""Workflows as graphs end to end, on a real stack (two workers as processes): parallel
branches that overlap in time, a join that gets every named input (image, NumPy array, bytes,
JSON), a NumPy workflow without an image, failure, cancellation and kill -9 in one branch; no
CDI object is left behind by any of them."""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import tempfile
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

import cdi
from orchestrator.stack import Stack
from tests.orchestrator import graph_tasks
from tests.orchestrator.conftest import deployed_tests_package
from tests.orchestrator.test_e2e import Harness, free_port, wait_for
from workflows import fanout_tasks, imagebuf
from workflows.api import TaskContext
from workflows.image_tasks import deblur, denoise, reference_pipeline
from workflows.samples import bundled_samples

GRAPH_TASKS = "tests.orchestrator.graph_tasks"
TASKS: dict[str, dict[str, Any]] = {
    "nap_blur": {"retries": 2},
    "measure": {"retries": 2},
    "combine": {"retries": 0},
    "fail_branch": {"retries": 0},
    "ramp": {"retries": 0},
    "scale": {"retries": 0},
    "tiles": {"retries": 0, "module": "workflows.fanout_tasks:tiles"},
    "blur_tile": {"retries": 1, "module": "workflows.fanout_tasks:blur_tile"},
    "stitch": {"retries": 0, "module": "workflows.fanout_tasks:stitch"},
}


@pytest.fixture(scope="module")
def harness() -> Iterator[Harness]:
    folder = tempfile.mkdtemp(prefix="cdiflow-graphs-")
    os.chmod(folder, 0o755)
    try:
        with (
            deployed_tests_package(),  # the tests' own tasks
            Stack(folder, workers=2, port=free_port(), tasks=[GRAPH_TASKS]) as stack,
        ):
            h = Harness(stack)
            for name, settings in TASKS.items():
                body = {"name": name, "module": f"{GRAPH_TASKS}:{name}", "timeout_s": 30,
                        "retry_backoff_s": 0.1, **settings}  # fmt: skip
                reply = h.api.post("/api/tasks", json=body)
                assert reply.status_code == 201, reply.text
            yield h
            h.api.close()
    finally:
        if not os.environ.get("KEEP_GRAPHS_STACK"):
            subprocess.run(["rm", "-rf", folder], check=False)


def _define(harness: Harness, name: str, steps: list[dict[str, Any]]) -> str:
    reply = harness.api.post("/api/workflow-definitions", json={"name": name, "tasks": steps})
    assert reply.status_code == 201, reply.text
    return name


def _diamond(harness: Harness, name: str, left: str = "nap_blur", ms: int = 1500) -> str:
    """``a`` (deblur) forks into ``b1`` (an image) and ``b2`` (an array, bytes and JSON), which
    ``c`` joins."""
    return _define(harness, name, [
        {"ref": "a", "task": "deblur"},
        {"ref": "b1", "task": left, "inputs": {"image": "a.image"}, "params": {"ms": ms}},
        {"ref": "b2", "task": "measure", "inputs": {"image": "a.image"}, "params": {"ms": ms}},
        {"ref": "c", "task": "combine", "inputs": {
            "blurred": "b1.image", "hist": "b2.hist", "row": "b2.row", "size": "b2.size"}},
    ])  # fmt: skip


def _start(harness: Harness, workflow: str, sample: str, policy: str = "transfer") -> str:
    image = harness.upload(f"in/{workflow}-{sample}", bundled_samples()[sample].read_bytes())
    _two_idle_workers(harness)
    return harness.start(image, policy, workflow=workflow)


def _two_idle_workers(harness: Harness) -> None:
    """Wait until both workers beat as alive and idle (the previous test's, or a restarted
    worker's, may not yet): branches can only overlap on two workers placement sees free."""

    def ready() -> bool:
        workers = harness.api.get("/api/workers").json()
        alive = [w for w in workers if w["alive"] and w["heartbeat_age_s"] < 2.5]
        return len(alive) == 2 and not any(w["running"] or w["queue_depth"] for w in alive)

    wait_for(ready, "two live, idle workers", timeout=30)


def _no_object_left(harness: Harness, workflow_id: str) -> None:
    """The minion holds no object of the run (they are freed as it ends)."""
    with cdi.Client(harness.stack.minion_socket) as probe:

        def none_left() -> bool:
            return not [o for o in probe.list_objects() if workflow_id in str(o["key"])]

        try:
            wait_for(none_left, f"the objects of {workflow_id} to be freed", timeout=30)
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {probe.list_objects()}") from None


def _running(harness: Harness, workflow_id: str, *refs: str) -> list[str]:
    """The workers running ``refs`` (each queued there, and each of those workers running a
    task by its heartbeat), or [] while not all of them run."""
    runs = harness.get(workflow_id)["task_runs"]
    queued = {r["ref"]: r["worker_id"] for r in runs if r["status"] == "QUEUED"}
    if set(refs) - set(queued):
        return []
    beats = {w["id"]: w for w in harness.api.get("/api/workers").json()}
    workers = [str(queued[ref]) for ref in refs]
    busy = all(beats.get(w, {}).get("running", 0) >= workers.count(w) for w in workers)
    return workers if busy else []


def _span(run: dict[str, Any]) -> tuple[float, float]:
    return (
        datetime.fromisoformat(run["started_at"]).timestamp(),
        datetime.fromisoformat(run["finished_at"]).timestamp(),
    )


def _local(sample: Path) -> tuple[Image.Image, dict[str, Any]]:
    """The diamond computed in this process: the join's image and output."""
    ctx = TaskContext("local", params={"ms": 0})
    image = imagebuf.decode_bytes(sample.read_bytes())
    sharpened = deblur(image, ctx).image
    assert sharpened is not None
    measured = graph_tasks.measure(sharpened, ctx)
    joined = graph_tasks.combine(graph_tasks.nap_blur(sharpened, ctx), measured["hist"],
                                 memoryview(measured["row"]), measured["size"], ctx)  # fmt: skip
    assert joined.image is not None
    return joined.image, dict(joined.output)


def _idle_workers(harness: Harness) -> int:
    workers = harness.api.get("/api/workers").json()
    return sum(w["alive"] and not w["running"] and not w["queue_depth"] for w in workers)


def _pixels_sha(image: Image.Image) -> str:
    return hashlib.sha256(np.asarray(image).tobytes()).hexdigest()


@pytest.mark.parametrize("policy", ["transfer", "affinity"])
def test_a_diamonds_branches_overlap_on_two_workers_and_its_join_gets_every_input(
    harness: Harness, policy: str
) -> None:
    workflow = _diamond(harness, f"diamond_{policy}")
    sample = bundled_samples()["sunset.jpg"]
    # Two free workers, as the heartbeats the scheduler places by say (a task of the test
    # before may still count as running on one, which then has no room for a branch).
    wait_for(lambda: _idle_workers(harness) >= 2, "two idle workers", timeout=30)
    workflow_id = _start(harness, workflow, "sunset.jpg", policy)
    done = harness.wait(workflow_id)
    assert done["status"] == "COMPLETED", done["error"]
    runs = {r["ref"]: r for r in done["task_runs"]}
    assert sorted(runs) == ["a", "b1", "b2", "c"] and len(done["task_runs"]) == 4
    (s1, f1), (s2, f2) = _span(runs["b1"]), _span(runs["b2"])
    placed = {ref: runs[ref]["worker_id"] for ref in ("a", "b1", "b2")}
    assert runs["b1"]["worker_id"] != runs["b2"]["worker_id"], (
        f"one worker ran both: {placed}; runs {done['task_runs']}; events {done['events']}; "
        f"workers now {harness.api.get('/api/workers').json()}"
    )
    assert s1 < f2 and s2 < f1, f"the branches ran one after the other: {placed} {done}"
    image, output = _local(sample)
    for key in ("blurred_size", "hist_total", "hist_sha", "row_sha", "size"):
        assert done["output"][key] == output[key], key
    result = Image.open(io.BytesIO(harness.download(done["result_uri"])))
    assert _pixels_sha(result) == _pixels_sha(image)
    # a's image was read by both branches at once: shared read-only, not copied.
    modes = {(h["datum"], h["mode"]) for h in done["handoffs"]}
    assert ("a.image", "share") in modes, modes
    _no_object_left(harness, workflow_id)


@pytest.mark.parametrize("policy", ["transfer", "auto"])
def test_a_diamonds_join_gets_each_branch_output_in_at_most_one_transfer(
    harness: Harness, policy: str
) -> None:
    """Ownership transfers per step: each branch's worker hands what it made straight to the
    join's worker (one transfer an object, none when the join runs where it was made); only
    the fork's image, which both branches read, goes back to the scheduler, which shares it
    with them."""
    workflow = _diamond(harness, f"diamond_direct_{policy}")
    wait_for(lambda: _idle_workers(harness) >= 2, "two idle workers", timeout=30)
    workflow_id = _start(harness, workflow, "sunset.jpg", policy)
    done = harness.wait(workflow_id)
    assert done["status"] == "COMPLETED", done["error"]
    worker_of = {r["ref"]: r["worker_id"] for r in done["task_runs"]}
    transfers = [(h["datum"], h["from_container"], h["to_container"])
                 for h in done["handoffs"] if h["mode"] == "transfer"]  # fmt: skip
    made = {"b1.image": "b1", "b2.hist": "b2", "b2.row": "b2"}  # b2's JSON goes inline
    for datum, step in made.items():
        src, dst = worker_of[step], worker_of["c"]
        moved = [(s, d) for name, s, d in transfers if name == datum]
        assert moved == ([(src, dst)] if src != dst else []), (datum, worker_of, transfers)
    # The fork's image leaves a's worker once, to the scheduler, which shares it (or hands
    # it to the last reader when none reads it any more).
    workers = set(worker_of.values())
    forked = [(s, d) for name, s, d in transfers if name == "a.image" and s in workers]
    assert len(forked) == 1 and forked[0][0] == worker_of["a"], (worker_of, transfers)
    assert forked[0][1] not in workers, (worker_of, transfers)
    assert {name for name, _, _ in transfers} <= {*made, "a.image"}, transfers
    _no_object_left(harness, workflow_id)


def test_a_numpy_workflow_without_an_image_stores_its_array_as_npy(harness: Harness) -> None:
    workflow = _define(harness, "numpy_scale", [
        {"ref": "ramp", "task": "ramp"},
        {"ref": "double", "task": "scale", "inputs": {"values": "ramp.values"},
         "params": {"by": 2}},
    ])  # fmt: skip
    reply = harness.api.post(
        "/api/workflows", json={"workflow": workflow, "input": {"data": {"n": 1000}}}
    )
    assert reply.status_code == 201, reply.text
    workflow_id = reply.json()["id"]
    done = harness.wait(workflow_id)
    assert done["status"] == "COMPLETED", done["error"]
    assert done["output"]["total"] == 2 * sum(range(1000))
    [uri] = done["output"]["results"].values()
    assert uri.endswith(".npy")
    stored = np.load(io.BytesIO(harness.download(uri)))
    assert np.array_equal(stored, np.arange(1000, dtype=np.float64) * 2)
    _no_object_left(harness, workflow_id)


def test_a_failed_branch_fails_the_workflow_and_leaves_nothing(harness: Harness) -> None:
    workflow = _define(harness, "diamond_failing", [
        {"ref": "a", "task": "deblur"},
        {"ref": "bad", "task": "fail_branch", "inputs": {"image": "a.image"},
         "params": {"ms": 300}},
        {"ref": "slow", "task": "measure", "inputs": {"image": "a.image"}, "params": {"ms": 2000}},
        {"ref": "c", "task": "combine", "inputs": {
            "blurred": "bad.image", "hist": "slow.hist", "row": "slow.row", "size": "slow.size"}},
    ])  # fmt: skip
    workflow_id = _start(harness, workflow, "night.jpg")
    done = harness.wait(workflow_id)
    assert done["status"] == "FAILED"
    assert "'bad' failed" in done["error"] and "always fails" in done["error"]
    assert "c" not in {r["ref"] for r in done["task_runs"]}
    _no_object_left(harness, workflow_id)


def test_a_cancelled_diamond_stops_both_branches_and_frees_their_objects(
    harness: Harness,
) -> None:
    workflow = _diamond(harness, "diamond_cancelled", ms=4000)
    workflow_id = _start(harness, workflow, "blue_sky.jpg")

    wait_for(lambda: _running(harness, workflow_id, "b1", "b2"), "both branches to run")
    assert harness.api.post(f"/api/workflows/{workflow_id}/cancel").status_code == 200
    done = harness.wait(workflow_id)
    assert done["status"] == "CANCELLED"
    assert "c" not in {r["ref"] for r in done["task_runs"]}
    _no_object_left(harness, workflow_id)


def test_a_worker_killed_in_one_branch_reruns_that_branch_only(harness: Harness) -> None:
    workflow = _diamond(harness, "diamond_killed", ms=3000)
    sample = bundled_samples()["green_field.jpg"]
    workflow_id = _start(harness, workflow, "green_field.jpg")

    [victim] = wait_for(lambda: _running(harness, workflow_id, "b1"), "b1 to run")
    harness.stack.kill_worker(victim)
    done = harness.wait(workflow_id, timeout=120)
    assert done["status"] == "COMPLETED", done["error"]
    runs = [(r["ref"], r["status"], r["attempt"]) for r in done["task_runs"]]
    b1 = [r for r in runs if r[0] == "b1"]
    assert [r[1:] for r in b1] == [("FAILED", 1), ("COMPLETED", 2)], runs
    for ref in ("a", "b2", "c"):  # the rest ran once: a's image was still held
        assert [r[1:] for r in runs if r[0] == ref] == [("COMPLETED", 1)], runs
    image, output = _local(sample)
    assert done["output"]["hist_sha"] == output["hist_sha"]
    result = Image.open(io.BytesIO(harness.download(done["result_uri"])))
    assert _pixels_sha(result) == _pixels_sha(image)
    _no_object_left(harness, workflow_id)


def test_a_worker_killed_holding_a_joins_input_has_the_join_run_elsewhere(
    harness: Harness,
) -> None:
    """``b1`` is quick and hands its image to the join's worker (or keeps it, being that
    worker) while ``b2`` still runs; that worker is killed and comes back under the same id
    before ``b2`` ends. The image came back to the scheduler (its recovery container), which
    moves it on to the join's worker; the join runs with the same result; nothing is left
    behind."""
    workflow = _define(harness, "diamond_join_worker_killed", [
        {"ref": "a", "task": "deblur"},
        {"ref": "b1", "task": "nap_blur", "inputs": {"image": "a.image"}, "params": {"ms": 0}},
        {"ref": "b2", "task": "measure", "inputs": {"image": "a.image"}, "params": {"ms": 8000}},
        {"ref": "c", "task": "combine", "inputs": {
            "blurred": "b1.image", "hist": "b2.hist", "row": "b2.row", "size": "b2.size"}},
    ])  # fmt: skip
    sample = bundled_samples()["sunset.jpg"]
    workflow_id = _start(harness, workflow, "sunset.jpg")

    def started_at(worker: str) -> float | None:
        """The start time of ``worker``'s process while it beats."""
        beats = {w["id"]: w for w in harness.api.get("/api/workers").json()}
        beat = beats.get(worker, {})
        return beat.get("started_at") if beat.get("alive") else None

    def join_worker() -> str | None:
        """The worker holding b1's image for the join, once b1 is done."""
        now = harness.get(workflow_id)
        b1 = [r for r in now["task_runs"] if r["ref"] == "b1" and r["status"] == "COMPLETED"]
        if not b1:
            return None
        on = [h["to_container"] for h in now["handoffs"] if h["datum"] == "b1.image"]
        return str(on[0] if on else b1[0]["worker_id"])

    victim = wait_for(join_worker, "b1 to hand its image on")
    before = started_at(victim)
    harness.stack.kill_worker(victim)
    wait_for(lambda: started_at(victim) not in (None, before), f"{victim} to start again")
    done = harness.wait(workflow_id, timeout=120)
    assert done["status"] == "COMPLETED", done["error"]
    image, output = _local(sample)
    assert done["output"]["hist_sha"] == output["hist_sha"]
    result = Image.open(io.BytesIO(harness.download(done["result_uri"])))
    assert _pixels_sha(result) == _pixels_sha(image)
    _no_object_left(harness, workflow_id)


@pytest.mark.parametrize(
    ("sample", "taken", "skipped"),
    [("night.jpg", "brighten", "keep"), ("blue_sky.jpg", "keep", "brighten")],
)
def test_a_switch_takes_the_side_its_value_chooses_and_skips_the_other(
    harness: Harness, sample: str, taken: str, skipped: str
) -> None:
    workflow = "switched"
    if harness.api.get(f"/api/workflow-definitions/{workflow}").status_code == 404:
        _define(harness, workflow, [
            {"ref": "label", "task": "classify"},
            {"ref": "route", "switch": "label.label", "cases": {"dark": ["brighten"]},
             "default": ["keep"]},
            {"ref": "brighten", "task": "nap_blur", "inputs": {"image": "label.image"}},
            {"ref": "keep", "task": "deblur", "inputs": {"image": "label.image"}},
            {"ref": "out", "task": "denoise",
             "inputs": {"image": ["brighten.image", "keep.image"]}},
        ])  # fmt: skip
    workflow_id = _start(harness, workflow, sample)
    done = harness.wait(workflow_id)
    assert done["status"] == "COMPLETED", done["error"]
    runs = {r["ref"]: r for r in done["task_runs"]}
    assert runs[skipped]["status"] == "SKIPPED" and runs[skipped]["worker_id"] is None
    assert runs[taken]["status"] == "COMPLETED"
    assert runs["route"]["output"]["case"] == ("dark" if taken == "brighten" else None)
    ctx = TaskContext("local", params={"ms": 0})
    image = imagebuf.decode_bytes(bundled_samples()[sample].read_bytes())
    side = graph_tasks.nap_blur(image, ctx) if taken == "brighten" else deblur(image, ctx).image
    assert side is not None
    expected = denoise(side, ctx).image
    assert expected is not None
    result = Image.open(io.BytesIO(harness.download(done["result_uri"])))
    assert _pixels_sha(result) == _pixels_sha(expected)
    _no_object_left(harness, workflow_id)


def test_a_fan_out_of_16_tiles_joins_back_to_the_same_pixels_as_in_one_process(
    harness: Harness,
) -> None:
    workflow = _define(harness, "tiled_blur", [
        {"ref": "split", "task": "tiles", "params": {"n": 4}},
        {"ref": "blur", "task": "blur_tile", "inputs": {"tile": "split.tiles"},
         "for_each": "tile"},
        {"ref": "join", "task": "stitch", "inputs": {"tiles": "blur.tile", "grid": "split.grid"}},
    ])  # fmt: skip
    sample = "sunset.jpg"
    workflow_id = _start(harness, workflow, sample)
    done = harness.wait(workflow_id)
    assert done["status"] == "COMPLETED", done["error"]
    blurs = [r for r in done["task_runs"] if r["ref"].startswith("blur[")]
    assert sorted(r["ref"] for r in blurs) == sorted(f"blur[{i}]" for i in range(16))
    assert {r["status"] for r in blurs} == {"COMPLETED"}
    assert len({r["worker_id"] for r in blurs}) == 2  # spread over both workers
    ctx = TaskContext("local", params={"n": 4})
    image = imagebuf.decode_bytes(bundled_samples()[sample].read_bytes())
    cut = fanout_tasks.tiles(image, ctx)
    blurred = [fanout_tasks.blur_tile(t, ctx)["tile"] for t in cut["tiles"]]
    expected = fanout_tasks.stitch(blurred, cut["grid"], ctx)
    result = Image.open(io.BytesIO(harness.download(done["result_uri"])))
    assert _pixels_sha(result) == _pixels_sha(expected)
    _no_object_left(harness, workflow_id)


def test_a_sub_workflow_runs_inside_a_step_and_its_outputs_go_on(harness: Harness) -> None:
    workflow = _define(harness, "with_sub_workflow", [
        {"ref": "pre", "task": "nap_blur"},
        {"ref": "enhance", "workflow": "image_pipeline", "depends_on": ["pre"]},
        {"ref": "post", "task": "denoise", "inputs": {"image": "enhance.image"}},
    ])  # fmt: skip
    sample = "green_field.jpg"
    workflow_id = _start(harness, workflow, sample)
    done = harness.wait(workflow_id)
    assert done["status"] == "COMPLETED", done["error"]
    refs = [r["ref"] for r in done["task_runs"]]
    assert refs == ["pre", "enhance/deblur", "enhance/denoise", "enhance/classify", "post"]
    ctx = TaskContext("local", params={"ms": 0})
    image = imagebuf.decode_bytes(bundled_samples()[sample].read_bytes())
    enhanced, label = reference_pipeline(graph_tasks.nap_blur(image, ctx))
    expected = denoise(enhanced, ctx).image
    assert expected is not None and done["output"]["label"] == label
    result = Image.open(io.BytesIO(harness.download(done["result_uri"])))
    assert _pixels_sha(result) == _pixels_sha(expected)
    _no_object_left(harness, workflow_id)
