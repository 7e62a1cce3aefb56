"""The orchestrator end to end: a real stack (Postgres, Redis, S3 endpoint, CDI controller and
minion, API, scheduler, two workers as processes), driven over its REST API like a user would."""

from __future__ import annotations

import io
import itertools
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

import boto3
import httpx
import numpy as np
import psycopg
import pytest
from PIL import Image

import cdi
from orchestrator.stack import Stack
from tests.orchestrator.conftest import deployed_tests_package
from workflows import imagebuf
from workflows.image_tasks import reference_pipeline
from workflows.samples import bundled_samples

MAX_INPUT_BYTES = 3_000_000
MAX_ACTIVE = 4  # workflows the scheduler runs at once; the rest wait PENDING
FINISHED = ("COMPLETED", "FAILED", "CANCELLED", "TIMED_OUT")
FLAKY_TASKS = "tests.orchestrator.flaky_tasks"  # the workers load it (--tasks)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class Harness:
    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.api = httpx.Client(base_url=stack.api_url, timeout=30, headers=stack.auth_headers)
        services = stack.services
        self.bucket = services.s3_bucket
        self.s3: Any = boto3.client(
            "s3",
            endpoint_url=services.s3_endpoint_url,
            region_name=services.aws_region,
            aws_access_key_id=services.aws_access_key_id,
            aws_secret_access_key=services.aws_secret_access_key,
        )

    def upload(self, key: str, data: bytes) -> str:
        self.s3.put_object(Bucket=self.bucket, Key=key, Body=data)
        return f"s3://{self.bucket}/{key}"

    def download(self, uri: str) -> bytes:
        bucket, key = uri.removeprefix("s3://").split("/", 1)
        body: bytes = self.s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        return body

    def start(
        self,
        image: str,
        policy: str = "affinity",
        plane: str = "cdi",
        workflow: str = "image_pipeline",
    ) -> str:
        body = {
            "workflow": workflow,
            "input": {"image": image},
            "policy": policy,
            "data_plane": plane,
        }
        reply = self.api.post("/api/workflows", json=body)
        assert reply.status_code == 201, reply.text
        workflow_id: str = reply.json()["id"]
        return workflow_id

    def get(self, workflow_id: str) -> dict[str, Any]:
        body: dict[str, Any] = (
            self.api.get(f"/api/workflows/{workflow_id}").raise_for_status().json()
        )
        return body

    def wait(self, workflow_id: str, timeout: float = 120) -> dict[str, Any]:
        done: dict[str, Any] = wait_for(
            lambda: self._finished(workflow_id), f"workflow {workflow_id}", timeout
        )
        return done

    def _finished(self, workflow_id: str) -> dict[str, Any] | None:
        body = self.get(workflow_id)
        return body if body["status"] in FINISHED else None


def wait_for(probe: Callable[[], Any], what: str, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


@pytest.fixture(scope="module")
def harness() -> Iterator[Harness]:
    folder = tempfile.mkdtemp(prefix="cdiflow-e2e-")
    os.chmod(folder, 0o755)
    previous = os.environ.get("MAX_INPUT_BYTES")
    os.environ["MAX_INPUT_BYTES"] = str(MAX_INPUT_BYTES)  # the stack's processes inherit it
    os.environ["MAX_ACTIVE_WORKFLOWS"] = str(MAX_ACTIVE)
    try:
        with (
            deployed_tests_package(),  # the tests' own tasks
            Stack(folder, workers=2, port=free_port(), tasks=[FLAKY_TASKS]) as stack,
        ):
            h = Harness(stack)
            yield h
            h.api.close()
            # Every workflow is finished: no CDI object may be left in the minion.
            with cdi.Client(stack.minion_socket) as probe:
                try:
                    stat = wait_for(
                        lambda: (s := probe.stat()) and s["objects"] == 0 and s,
                        "the minion to hold no object",
                        timeout=30,
                    )
                except AssertionError as exc:
                    raise AssertionError(f"{exc}: {probe.list_objects()}") from None
                assert stat["used_segments"] == 0
    finally:
        os.environ.pop("MAX_ACTIVE_WORKFLOWS", None)
        if previous is None:
            os.environ.pop("MAX_INPUT_BYTES", None)
        else:
            os.environ["MAX_INPUT_BYTES"] = previous
        subprocess.run(["rm", "-rf", folder], check=False)


def expected(sample: Path) -> tuple[np.ndarray[Any, Any], str]:
    image, label = reference_pipeline(imagebuf.decode_bytes(sample.read_bytes()))
    return np.asarray(image), label


def assert_result_is_the_pipelines(harness: Harness, done: dict[str, Any], sample: Path) -> None:
    """The stored result and label are what the image pipeline computes on ``sample`` locally."""
    pixels, label = expected(sample)
    result = np.asarray(Image.open(io.BytesIO(harness.download(done["result_uri"]))))
    assert result.shape == pixels.shape
    assert np.array_equal(result, pixels)
    assert done["output"]["label"] == label


@pytest.mark.parametrize(
    ("policy", "plane"),
    [("affinity", "cdi"), ("transfer", "cdi"), ("auto", "cdi"), ("affinity", "object-store")],
)
def test_result_equals_the_same_pillow_operations_applied_locally(
    harness: Harness, policy: str, plane: str
) -> None:
    sample = bundled_samples()["green_field.jpg"]
    image = harness.upload(f"in/{policy}-{plane}.jpg", sample.read_bytes())
    done = harness.wait(harness.start(image, policy, plane))
    assert done["status"] == "COMPLETED", done["error"]
    assert_result_is_the_pipelines(harness, done, sample)
    runs = done["task_runs"]
    assert [r["ref"] for r in runs] == ["deblur", "denoise", "classify"]
    assert all(r["status"] == "COMPLETED" and r["worker_id"] for r in runs)
    # Each run records its task's own CPU time: some, and no more than the run's wall time.
    assert all(0 < r["cpu_ms"] <= r["run_ms"] for r in runs), runs
    if policy == "affinity":
        assert len({r["worker_id"] for r in runs}) == 1
    if plane == "cdi" and policy in ("transfer", "auto"):
        # Each task's worker hands the object straight to the next one's, or keeps it.
        assert_handed_from_worker_to_worker(done)
    elif policy == "affinity":
        # One worker makes the object from the input, runs every task and stores the result.
        assert not done["handoffs"], done["handoffs"]


def assert_handed_from_worker_to_worker(done: dict[str, Any]) -> None:
    """Between two steps of the chain the image moved at most once, straight from the first
    step's worker to the next one's, and not at all when both ran on the same worker: no
    hand-off went through the scheduler."""
    runs, handoffs = done["task_runs"], done["handoffs"]
    moves = [(h["from_container"], h["to_container"], h["mode"]) for h in handoffs]
    boundaries = [(a["worker_id"], b["worker_id"]) for a, b in itertools.pairwise(runs)]
    assert moves == [(a, b, "transfer") for a, b in boundaries if a != b], (boundaries, handoffs)


@pytest.mark.parametrize("policy", ["transfer", "auto"])
def test_each_step_hands_its_image_on_in_at_most_one_transfer(
    harness: Harness, policy: str
) -> None:
    """Runs side by side, so that both workers take steps: each run's image moves once at a
    step boundary whose two steps ran on two workers, from the one to the other, and not at
    all where they ran on one; every result is the pipeline's."""
    sample = bundled_samples()["green_field.jpg"]
    image = harness.upload(f"in/direct-{policy}.jpg", sample.read_bytes())
    ids = [harness.start(image, policy) for _ in range(8)]
    for workflow_id in ids:
        done = harness.wait(workflow_id)
        assert done["status"] == "COMPLETED", done["error"]
        assert_result_is_the_pipelines(harness, done, sample)
        assert [r["ref"] for r in done["task_runs"]] == ["deblur", "denoise", "classify"]
        assert_handed_from_worker_to_worker(done)


@pytest.mark.parametrize("plane", ["cdi", "object-store"])
def test_a_jpeg_result_is_the_jpeg_of_the_same_pixels(harness: Harness, plane: str) -> None:
    """result_format=jpeg: the result is the JPEG (quality 90) of exactly the pixels a PNG
    result would hold; on the object-store plane the images between tasks stay lossless."""
    sample = bundled_samples()["blue_sky.jpg"]
    image = harness.upload(f"in/jpeg-{plane}.jpg", sample.read_bytes())
    body = {"workflow": "image_pipeline", "input": {"image": image, "result_format": "jpeg"},
            "policy": "transfer", "data_plane": plane}  # fmt: skip
    reply = harness.api.post("/api/workflows", json=body)
    assert reply.status_code == 201, reply.text
    done = harness.wait(reply.json()["id"])
    assert done["status"] == "COMPLETED", done["error"]
    assert done["result_uri"].endswith(".jpg")
    pixels, _ = expected(sample)
    reference = imagebuf.encode_image(Image.fromarray(pixels), "JPEG")
    result = np.asarray(Image.open(io.BytesIO(harness.download(done["result_uri"]))))
    assert np.array_equal(result, np.asarray(Image.open(io.BytesIO(reference))))


def test_the_object_store_plane_stores_intermediates_in_the_format_asked(
    harness: Harness,
) -> None:
    """intermediate_format=raw keeps the images between tasks lossless (the result is the
    pipeline's to the pixel); jpeg degrades them (same size, other pixels)."""
    sample = bundled_samples()["green_field.jpg"]
    image = harness.upload("in/intermediate.jpg", sample.read_bytes())
    pixels, label = expected(sample)
    results = {}
    for fmt in ("raw", "jpeg"):
        body = {"workflow": "image_pipeline", "input": {"image": image, "intermediate_format": fmt},
                "policy": "transfer", "data_plane": "object-store"}  # fmt: skip
        reply = harness.api.post("/api/workflows", json=body)
        assert reply.status_code == 201, reply.text
        done = harness.wait(reply.json()["id"])
        assert done["status"] == "COMPLETED", done["error"]
        assert done["result_uri"].endswith(".png") and done["output"]["label"] == label
        results[fmt] = np.asarray(Image.open(io.BytesIO(harness.download(done["result_uri"]))))
    assert np.array_equal(results["raw"], pixels)
    assert results["jpeg"].shape == pixels.shape and not np.array_equal(results["jpeg"], pixels)
    bad = {"workflow": "image_pipeline", "input": {"image": image, "intermediate_format": "gif"}}
    reply = harness.api.post("/api/workflows", json=bad)
    assert reply.status_code == 422 and "intermediate_format" in reply.text, reply.text


def _half_a_jpeg() -> bytes:
    out = io.BytesIO()
    noise = np.random.default_rng(7).integers(0, 256, (120, 160, 3), dtype=np.uint8)
    Image.fromarray(noise).save(out, "JPEG")
    return out.getvalue()[: out.tell() // 2]


@pytest.mark.parametrize(
    ("name", "data", "reason"),
    [
        ("missing", None, "does not exist"),
        ("not-an-image", b"this is plain text, not a picture" * 10, "not a recognised image"),
        ("too-large", os.urandom(MAX_INPUT_BYTES + 1), "limit"),
        # A good header, then nothing: fails while decoding into the object the scheduler made.
        ("truncated-jpeg", _half_a_jpeg(), "corrupt or truncated"),
    ],
)
def test_bad_inputs_fail_their_workflow_with_a_reason_and_no_worker_dies(
    harness: Harness, name: str, data: bytes | None, reason: str
) -> None:
    pids = {w: harness.stack.pid_of(w) for w in harness.stack.worker_ids}
    uri = (
        f"s3://{harness.bucket}/nowhere/{name}.jpg"
        if data is None
        else harness.upload(f"bad/{name}.jpg", data)
    )
    for plane in ("cdi", "object-store"):
        done = harness.wait(harness.start(uri, "transfer", plane))
        assert done["status"] == "FAILED"
        assert reason in done["error"], done["error"]
        assert uri in done["error"] or plane == "object-store"
    assert {w: harness.stack.pid_of(w) for w in harness.stack.worker_ids} == pids


def test_a_dataless_workflow_moves_no_data_and_passes_its_input_to_tasks(
    harness: Harness,
) -> None:
    """Started without an image: no S3, no CDI object; tasks get img=None and ctx.input. The
    long poll (?wait_s=) answers once the run has finished."""
    api = harness.api
    task = {"name": "echo_input", "module": "tests.orchestrator.flaky_tasks:echo_input"}
    assert api.post("/api/tasks", json=task).status_code == 201
    steps = [{"ref": "echo", "task": "echo_input"}, {"ref": "after", "task": "noop",
                                                     "depends_on": ["echo"]}]  # fmt: skip
    reply = api.post("/api/workflow-definitions", json={"name": "echo_pipeline", "tasks": steps})
    assert reply.status_code == 201, reply.text
    for policy in ("affinity", "transfer", "auto"):
        body = {"workflow": "echo_pipeline", "input": {"data": {"order": 42}}, "policy": policy}
        if policy == "auto":  # start and wait: one request
            done = api.post("/api/workflows", params={"wait_s": 30}, json=body).json()
        else:
            started = api.post("/api/workflows", json=body)
            assert started.status_code == 201, started.text
            waited = api.get(f"/api/workflows/{started.json()['id']}", params={"wait_s": 30})
            done = waited.raise_for_status().json()
        assert done["status"] == "COMPLETED", done["error"]
        assert done["result_uri"] is None
        assert done["output"]["tasks"]["echo"] == {"echo": {"order": 42}, "had_image": False}
        assert [r["status"] for r in done["task_runs"]] == ["COMPLETED", "COMPLETED"]
        assert done["handoffs"] == []


def test_a_burst_waits_pending_beyond_the_active_limit(harness: Harness) -> None:
    """12 started at once: never more than MAX_ACTIVE running, and every one completes."""
    api = harness.api
    steps = [{"ref": "nap", "task": "sleep", "params": {"ms": 150}}]
    reply = api.post("/api/workflow-definitions", json={"name": "nap_once", "tasks": steps})
    assert reply.status_code == 201, reply.text
    ids = [
        api.post("/api/workflows", json={"workflow": "nap_once", "input": {}}).json()["id"]
        for _ in range(12)
    ]
    running_at_most, deadline = 0, time.monotonic() + 120
    while time.monotonic() < deadline:
        page = api.get("/api/workflows", params={"workflow": "nap_once", "limit": 100}).json()
        states = [w["status"] for w in page["items"]]
        running_at_most = max(running_at_most, states.count("RUNNING"))
        if all(s in FINISHED for s in states):
            break
        time.sleep(0.02)
    else:
        raise AssertionError("the burst did not finish within 120 s")
    assert 0 < running_at_most <= MAX_ACTIVE
    assert all(harness.get(i)["status"] == "COMPLETED" for i in ids)


def _at_once(harness: Harness, bodies: list[tuple[dict[str, Any], dict[str, str]]]) -> list[Any]:
    """Each (body, headers) posted as a start, all at once from as many connections."""
    with ThreadPoolExecutor(len(bodies)) as pool:
        return list(
            pool.map(lambda b: harness.api.post("/api/workflows", json=b[0], headers=b[1]), bodies)
        )


def _created_events(harness: Harness, ids: list[str]) -> dict[str, int]:
    """How many ``workflow.created`` events each run has."""
    url = harness.stack.services.database_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT workflow_id::text, count(*) FROM events WHERE kind = 'workflow.created' "
            "AND workflow_id = ANY(%s::uuid[]) GROUP BY workflow_id",
            (ids,),
        ).fetchall()
    return {str(i): int(str(n)) for i, n in rows}


def test_concurrent_starts_are_each_recorded_once_and_run(harness: Harness) -> None:
    """40 starts from 40 connections at once (the API writes those that arrive together in one
    statement and commit): 40 runs, each recorded once, each completed."""
    tag = f"together-{uuid.uuid4().hex[:8]}"
    body = {"workflow": "noop_pipeline", "input": {}, "tags": [tag], "policy": "transfer"}
    replies = _at_once(harness, [(body, {})] * 40)
    assert [r.status_code for r in replies] == [201] * 40, [r.text for r in replies]
    ids = [r.json()["id"] for r in replies]
    assert len(set(ids)) == 40
    listed = harness.api.get("/api/workflows", params={"tag": tag, "limit": 100}).json()
    assert sorted(w["id"] for w in listed["items"]) == sorted(ids)
    assert _created_events(harness, ids) == dict.fromkeys(ids, 1)
    assert all(harness.wait(i)["status"] == "COMPLETED" for i in ids)


def test_a_bad_start_among_concurrent_ones_fails_alone(harness: Harness) -> None:
    """Among 12 good starts sent at once: one of a workflow that does not exist (404), one
    reusing an Idempotency-Key with another body (422), one repeating a keyed start (the run
    that start made, replayed). The good ones are answered and run as if alone."""
    key = {"Idempotency-Key": f"e2e-{uuid.uuid4()}"}
    good = {"workflow": "noop_pipeline", "input": {}}
    first = harness.api.post("/api/workflows", json=good, headers=key)
    assert first.status_code == 201, first.text
    other = {"workflow": "noop_pipeline", "input": {"data": {"n": 1}}}
    missing = {"workflow": "no_such_workflow", "input": {}}
    bodies: list[tuple[dict[str, Any], dict[str, str]]] = [(good, {}) for _ in range(12)]
    bodies[3], bodies[7], bodies[9] = (missing, {}), (other, key), (good, key)
    replies = _at_once(harness, bodies)
    assert replies[3].status_code == 404, replies[3].text
    assert replies[7].status_code == 422 and replies[7].json()["code"] == "idempotency_key_reused"
    assert replies[9].status_code == 201 and replies[9].headers["Idempotent-Replayed"] == "true"
    assert replies[9].json()["id"] == first.json()["id"]
    fine = [r for n, r in enumerate(replies) if n not in (3, 7, 9)]
    assert [r.status_code for r in fine] == [201] * 9, [r.text for r in fine]
    assert all("Idempotent-Replayed" not in r.headers for r in fine)
    ids = [r.json()["id"] for r in fine] + [first.json()["id"]]
    assert len(set(ids)) == 10
    assert _created_events(harness, ids) == dict.fromkeys(ids, 1)
    assert all(harness.wait(i)["status"] == "COMPLETED" for i in ids)


def test_an_image_task_in_a_dataless_workflow_fails_it_with_a_reason(harness: Harness) -> None:
    pids = {w: harness.stack.pid_of(w) for w in harness.stack.worker_ids}
    started = harness.api.post("/api/workflows", json={"workflow": "image_pipeline", "input": {}})
    assert started.status_code == 201, started.text
    done = harness.wait(started.json()["id"])
    assert done["status"] == "FAILED"
    assert "needs an input image" in done["error"], done["error"]
    assert [r["status"] for r in done["task_runs"]] == ["FAILED"]  # a retry cannot help
    assert {w: harness.stack.pid_of(w) for w in harness.stack.worker_ids} == pids


def _register_napping(harness: Harness, name: str, nap: dict[str, Any]) -> str:
    """Register the nap task ``nap`` and the pipeline ``name``: deblur, a 3 s nap, denoise,
    classify."""
    reply = harness.api.post("/api/tasks", json={"module": "workflows.image_tasks:sleep", **nap})
    assert reply.status_code == 201, reply.text
    reply = harness.api.post(
        "/api/workflow-definitions",
        json={
            "name": name,
            "tasks": [
                {"ref": "deblur", "task": "deblur"},
                {"ref": "nap", "task": nap["name"], "depends_on": ["deblur"],
                 "params": {"ms": 3000}},
                {"ref": "denoise", "task": "denoise", "depends_on": ["nap"]},
                {"ref": "classify", "task": "classify", "depends_on": ["denoise"]},
            ],
        },
    )  # fmt: skip
    assert reply.status_code == 201, reply.text
    return name


@pytest.fixture(scope="module")
def napping(harness: Harness) -> str:
    """A user-registered pipeline with a 3 s step, to act while a task is running."""
    nap = {"name": "nap", "timeout_s": 20, "retries": 2, "retry_backoff_s": 0.1}
    return _register_napping(harness, "napping_pipeline", nap)


def _kill_the_napping_worker(
    harness: Harness, napping: str, sample: Path, policy: str, sig: int = signal.SIGKILL
) -> tuple[dict[str, Any], str]:
    """Start the napping pipeline on ``sample``, send ``sig`` to the worker while its nap task
    runs; the completed workflow and the worker signalled."""
    workflow_id = harness.start(
        harness.upload(f"in/kill-{policy}.jpg", sample.read_bytes()), policy, workflow=napping
    )

    def napping_worker() -> str | None:
        runs = harness.get(workflow_id)["task_runs"]
        nap = [r for r in runs if r["ref"] == "nap"]
        if not nap:
            return None
        worker = nap[-1]["worker_id"]
        beats = {w["id"]: w for w in harness.api.get("/api/workers").json()}
        return str(worker) if beats.get(worker, {}).get("running", 0) >= 1 else None

    victim = wait_for(napping_worker, "the nap task to be running", timeout=60)
    if policy == "affinity":
        # deblur's image is the nap's input, held in the worker's memory: its heartbeat (one
        # falls within the 3 s nap) counts it, and the API shows it.
        def held() -> bool:
            beats = {w["id"]: w for w in harness.api.get("/api/workers").json()}
            return bool(beats[victim]["held_images"] == 1 and beats[victim]["held_bytes"] > 0)

        wait_for(held, "the worker's heartbeat to count the held image", timeout=10)
    harness.stack.kill_worker(victim, sig)
    done = harness.wait(workflow_id, timeout=120)
    assert done["status"] == "COMPLETED", done["error"]
    return done, victim


def _not_in_the_killed_process(harness: Harness, run: dict[str, Any], victim: str) -> bool:
    """``run`` ran on another worker, or on the victim's name once its supervisor had started
    it again (a restarted worker keeps its id; the rerun may land on it)."""
    if run["worker_id"] != victim:
        return True
    workers = {w["id"]: w for w in harness.api.get("/api/workers").json()}
    restarted = float(workers[victim]["started_at"])
    return datetime.fromisoformat(run["started_at"]).timestamp() >= restarted


def test_a_worker_killed_mid_task_is_replaced_and_the_result_is_unchanged(
    harness: Harness, napping: str
) -> None:
    sample = bundled_samples()["sunset.jpg"]
    done, victim = _kill_the_napping_worker(harness, napping, sample, "transfer")
    naps = [r for r in done["task_runs"] if r["ref"] == "nap"]
    assert naps[0]["status"] == "FAILED" and naps[0]["worker_id"] == victim
    assert [(r["status"], r["attempt"]) for r in naps] == [("FAILED", 1), ("COMPLETED", 2)], naps
    assert _not_in_the_killed_process(harness, naps[-1], victim), naps
    assert_result_is_the_pipelines(harness, done, sample)


def test_a_worker_killed_holding_an_image_under_affinity_has_it_recomputed(
    harness: Harness, napping: str
) -> None:
    """Under affinity the worker holds deblur's image in memory, unwritten, through the nap; its
    death loses it, and the scheduler runs deblur again from the input object."""
    sample = bundled_samples()["night.jpg"]
    done, victim = _kill_the_napping_worker(harness, napping, sample, "affinity")
    deblurs = [r for r in done["task_runs"] if r["ref"] == "deblur"]
    assert [(r["status"], r["attempt"]) for r in deblurs] == [("COMPLETED", 1), ("COMPLETED", 2)]
    assert deblurs[0]["worker_id"] == victim
    assert _not_in_the_killed_process(harness, deblurs[1], victim), deblurs
    naps = [r for r in done["task_runs"] if r["ref"] == "nap"]
    assert naps[0]["status"] == "FAILED" and "from that step again" in naps[0]["error"], naps[0]
    assert [r["attempt"] for r in naps] == [1, 2]
    assert_result_is_the_pipelines(harness, done, sample)


def test_a_worker_restarted_between_tasks_under_affinity_has_its_held_image_recomputed(
    harness: Harness, napping: str
) -> None:
    """SIGTERM mid-nap: the worker finishes the nap, holding its image, and exits; the next
    instruction waits in its queue for the restarted worker, which holds nothing. Whichever
    notices first (that worker's report, or the scheduler seeing the restart), deblur runs
    again from the input object and the result is the same."""
    sample = bundled_samples()["green_field.jpg"]
    done, victim = _kill_the_napping_worker(harness, napping, sample, "affinity", signal.SIGTERM)
    runs = [(r["ref"], r["status"], r["attempt"], r["worker_id"]) for r in done["task_runs"]]
    assert ("nap", "COMPLETED", 1, victim) in runs, runs  # it finished the nap, then exited
    deblurs = [r[1:3] for r in runs if r[0] == "deblur"]
    assert deblurs == [("COMPLETED", 1), ("COMPLETED", 2)], runs
    assert_result_is_the_pipelines(harness, done, sample)


@pytest.fixture(scope="module")
def napping_without_retries(harness: Harness) -> str:
    """The napping pipeline whose nap has no retries (a task's default): deblur (retries 2, so
    the worker holds its image) feeds a step that must not spend a retry it does not have."""
    name = _register_napping(
        harness, "napping_without_retries", {"name": "nap_once", "timeout_s": 20}
    )
    [task] = [t for t in harness.api.get("/api/tasks").json() if t["name"] == "nap_once"]
    assert task["retries"] == 0, task
    return name


def test_a_held_image_lost_with_its_worker_spends_no_retry_of_the_step_reading_it(
    harness: Harness, napping_without_retries: str
) -> None:
    """The worker dies holding deblur's image through the nap, which has no retries: deblur
    runs again elsewhere, and so does the nap, whose attempt was lost with the worker."""
    sample = bundled_samples()["sunset.jpg"]
    done, victim = _kill_the_napping_worker(harness, napping_without_retries, sample, "affinity")
    runs = [(r["ref"], r["status"], r["attempt"], r["worker_id"]) for r in done["task_runs"]]
    assert runs[0][3] == victim, runs
    assert [r[1:3] for r in runs if r[0] == "deblur"] == [("COMPLETED", 1), ("COMPLETED", 2)]
    assert [r[1:3] for r in runs if r[0] == "nap"] == [("FAILED", 1), ("COMPLETED", 2)], runs
    assert_result_is_the_pipelines(harness, done, sample)


@pytest.fixture(scope="module")
def napping_first(harness: Harness, napping: str) -> str:
    """The nap as the first step: a worker killed then dies holding the object it made from
    the S3 input."""
    steps = [
        {"ref": "nap", "task": "nap", "params": {"ms": 3000}},
        {"ref": "deblur", "task": "deblur", "depends_on": ["nap"]},
        {"ref": "denoise", "task": "denoise", "depends_on": ["deblur"]},
        {"ref": "classify", "task": "classify", "depends_on": ["denoise"]},
    ]
    body = {"name": "nap_first_pipeline", "tasks": steps}
    reply = harness.api.post("/api/workflow-definitions", json=body)
    assert reply.status_code == 201, reply.text
    return "nap_first_pipeline"


def test_a_worker_killed_in_the_first_task_has_its_object_dropped_and_the_input_fetched_again(
    harness: Harness, napping_first: str
) -> None:
    """The first task's worker made the workflow's object from the input; killed, the object
    comes back to the scheduler, which destroys it (it may be half-written) and has the retry
    fetch the input again. The harness checks that no object is left at the end."""
    sample = bundled_samples()["blue_sky.jpg"]
    done, victim = _kill_the_napping_worker(harness, napping_first, sample, "transfer")
    naps = [(r["status"], r["attempt"], r["worker_id"]) for r in done["task_runs"]
            if r["ref"] == "nap"]  # fmt: skip
    assert naps[0][:2] == ("FAILED", 1) and naps[0][2] == victim, naps
    assert naps[-1][:2] == ("COMPLETED", 2) and naps[-1][2] != victim, naps
    assert_result_is_the_pipelines(harness, done, sample)


def test_two_schedulers_never_schedule_a_workflow_twice(harness: Harness) -> None:
    second = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.scheduler", "--id", "scheduler-2"],
        env=harness.stack.environment(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        sample = bundled_samples()["night.jpg"]
        image = harness.upload("in/two.jpg", sample.read_bytes())
        ids = [harness.start(image, "transfer") for _ in range(12)]
        finished = [harness.wait(i) for i in ids]
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(timeout=30)
    for done in finished:
        assert done["status"] == "COMPLETED", done["error"]
        refs = [r["ref"] for r in done["task_runs"]]
        assert refs == ["deblur", "denoise", "classify"], refs  # each step ran exactly once


def test_cancel_stops_a_running_workflow_and_frees_its_object(
    harness: Harness, napping: str
) -> None:
    image = harness.upload("in/cancel.jpg", bundled_samples()["blue_sky.jpg"].read_bytes())
    workflow_id = harness.start(image, "affinity", workflow=napping)
    wait_for(lambda: harness.get(workflow_id)["status"] == "RUNNING", "RUNNING")
    assert harness.api.post(f"/api/workflows/{workflow_id}/cancel").status_code == 200
    assert harness.wait(workflow_id)["status"] == "CANCELLED"
    retried = harness.api.post(f"/api/workflows/{workflow_id}/retry").json()
    assert harness.wait(retried["id"])["status"] == "COMPLETED"


def test_a_failed_task_is_retried_with_backoff_and_a_slow_one_times_out(
    harness: Harness,
) -> None:
    api = harness.api
    for task in (
        {
            "name": "flaky",
            "module": "tests.orchestrator.flaky_tasks:fail_first_attempt",
            "timeout_s": 20,
            "retries": 2,
            "retry_backoff_s": 0.3,
        },
        {
            "name": "too_slow",
            "module": "workflows.image_tasks:sleep",
            "timeout_s": 0.5,
            "retries": 0,
            "retry_backoff_s": 0.1,
        },
    ):
        assert api.post("/api/tasks", json=task).status_code == 201
    for name, step in (("flaky_pipeline", "flaky"), ("slow_pipeline", "too_slow")):
        reply = api.post(
            "/api/workflow-definitions",
            json={
                "name": name,
                "tasks": [
                    {"ref": step, "task": step, "params": {"ms": 5000}},
                    {"ref": "classify", "task": "classify", "depends_on": [step]},
                ],
            },
        )
        assert reply.status_code == 201, reply.text
    image = harness.upload("in/retry.jpg", bundled_samples()["night.jpg"].read_bytes())
    flaky = harness.wait(harness.start(image, "transfer", workflow="flaky_pipeline"))
    assert flaky["status"] == "COMPLETED", flaky["error"]
    attempts = [r for r in flaky["task_runs"] if r["ref"] == "flaky"]
    assert [r["status"] for r in attempts] == ["FAILED", "COMPLETED"]
    assert "transient failure" in attempts[0]["error"]
    slow = harness.wait(harness.start(image, "transfer", workflow="slow_pipeline"))
    assert slow["status"] == "FAILED"
    assert [r["status"] for r in slow["task_runs"]] == ["TIMED_OUT"]
    assert "too_slow" in slow["error"]
