"""The ``cdi`` plane between tasks: a new image in a fresh object, the input kept or held in the
worker's memory for the next task, and what a failure leaves for the retry."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from PIL import Image, ImageFilter

import cdi
from orchestrator.contract.messages import Report
from tests.orchestrator.worker.support import (
    BUCKET,
    SCHEDULER,
    Stack,
    WorkerProcess,
    picture,
    poll,
    same_pixels,
    unsharp,
)
from workflows.imagebuf import decode_bytes, required_size


def test_deblur_gives_a_new_object_with_unsharp_pixels(stack: Stack, worker: WorkerProcess) -> None:
    img = picture()
    key = stack.put(worker, img)
    out_key = f"{key}-out"
    report = stack.run(worker, task="deblur", key=key, output_key=out_key)
    assert report.status == "COMPLETED", report.error
    assert (report.key, report.kept) == (out_key, False)
    assert report.bytes_in == report.bytes_out == required_size(64, 48, "RGB")
    assert report.started_at <= report.finished_at
    assert min(report.read_ms, report.compute_ms, report.write_ms) >= 0
    assert report.cpu_ms is not None and 0 < report.cpu_ms <= report.compute_ms  # its thread's
    result = stack.take_image(out_key)
    assert same_pixels(result, unsharp(img))
    with pytest.raises(cdi.ObjectNotFound):
        stack.sched.use(key)  # the input was destroyed


def test_a_missing_input_object_fails_the_task_with_a_reason(
    stack: Stack, worker: WorkerProcess
) -> None:
    key = f"obj-{uuid.uuid4().hex}"  # never created
    report = stack.run(worker, task="deblur", key=key, output_key=f"{key}-out")
    assert report.status == "FAILED"
    assert f"CDI object {key!r} does not exist" in (report.error or ""), report.error
    assert (report.key, report.kept) == (key, False)
    assert report.cpu_ms is None  # the task never ran: no CPU time, rather than a zero
    assert worker.proc.poll() is None  # the worker lives on for the next task
    assert stack.owner(f"{key}-out") is None  # and made no output


def test_keep_leaves_the_object_with_the_worker(stack: Stack, worker: WorkerProcess) -> None:
    key = stack.put(worker, picture())
    report = stack.run(worker, task="denoise", key=key, output_key=f"{key}-1", keep=True)
    assert report.status == "COMPLETED", report.error
    assert (report.key, report.kept) == (f"{key}-1", True)
    assert stack.owner(f"{key}-1") == worker.worker_id
    # The next task comes to the same worker, which already owns it, and hands it back.
    report = stack.run(worker, task="noop", key=f"{key}-1", output_key=f"{key}-2")
    assert report.status == "COMPLETED", report.error
    assert (report.key, report.kept, report.bytes_out) == (f"{key}-1", False, 0)
    stack.take(f"{key}-1")


def test_hand_to_gives_the_new_image_straight_to_the_next_worker_and_the_scheduler_recovers_it(
    stack: Stack, worker: WorkerProcess
) -> None:
    """One transfer from worker to worker; the object keeps the scheduler as its recovery
    container, so when the next worker dies holding it, it comes back to the scheduler."""
    img = picture()
    key = stack.put(worker, img)
    other = stack.start_worker()
    try:
        report = stack.run(worker, task="deblur", key=key, output_key=f"{key}-1",
                           hand_to=other.worker_id)  # fmt: skip
        assert report.status == "COMPLETED", report.error
        assert (report.key, report.kept, report.handed_to) == (f"{key}-1", False, other.worker_id)
        assert report.return_us > 0
        assert stack.owner(f"{key}-1") == other.worker_id
        # The next task, on the other worker, reads it where it is and hands it on again.
        report = stack.run(other, task="noop", key=f"{key}-1", hand_to=worker.worker_id)
        assert report.status == "COMPLETED", report.error
        assert (report.key, report.handed_to) == (f"{key}-1", worker.worker_id)
        report = stack.run(worker, task="noop", key=f"{key}-1", hand_to=other.worker_id)
        assert stack.owner(f"{key}-1") == other.worker_id
    finally:
        other.kill()
    assert same_pixels(stack.take_image(f"{key}-1"), unsharp(img))  # recovered by the scheduler


def test_hand_to_a_worker_that_is_gone_or_after_a_failure_hands_the_image_back(
    stack: Stack, worker: WorkerProcess
) -> None:
    key = stack.put(worker, picture())
    report = stack.run(worker, task="deblur", key=key, output_key=f"{key}-1", hand_to="wt-gone")
    assert report.status == "COMPLETED", report.error
    assert (report.key, report.kept, report.handed_to) == (f"{key}-1", False, "")
    assert stack.owner(f"{key}-1") == SCHEDULER
    stack.sched.use(f"{key}-1").transfer(worker.worker_id)
    report = stack.run(worker, task="no_such_task", key=f"{key}-1", hand_to=SCHEDULER + "-x")
    assert report.status == "FAILED"
    assert (report.key, report.handed_to) == (f"{key}-1", "")
    stack.take(f"{key}-1")


def test_hand_to_gives_the_named_outputs_on_with_the_image_or_back_when_it_is_gone(
    stack: Stack, worker: WorkerProcess
) -> None:
    """A step whose outputs one step alone reads (a join's input) hands them on where its
    image goes: each in one transfer, the report saying so (``handed_to``); to a worker that
    is gone, every one comes back, the report naming the outputs (``returned``) beside the
    image (its ``key``, with no ``handed_to``)."""

    def tiles(to: str) -> tuple[Report, list[str]]:
        key = stack.put(worker, picture())
        report = stack.run(worker, task="workflows.fanout_tasks:tiles", key=key,
                           params={"n": 2}, outputs={"tiles": f"{key}-t"},
                           hand_to=to)  # fmt: skip
        assert report.status == "COMPLETED", report.error
        assert report.key == key  # the image, read and passed on unchanged
        return report, [key, *(f"{key}-t.{i}" for i in range(4))]

    report, objects = tiles("wt-gone")
    assert (report.handed_to, sorted(report.returned)) == ("", sorted(objects[1:]))
    assert {k: stack.owner(k) for k in objects} == dict.fromkeys(objects, SCHEDULER)
    for k in objects:
        stack.take(k)
    other = stack.start_worker()
    try:
        report, objects = tiles(other.worker_id)
        assert (report.handed_to, report.returned, report.kept) == (other.worker_id, [], False)
        assert {k: stack.owner(k) for k in objects} == dict.fromkeys(objects, other.worker_id)
    finally:
        other.kill()
    for k in objects:
        stack.take(k)  # back with the scheduler, their recovery container, when it died


def _gaussian(img: Image.Image) -> Image.Image:
    return img.filter(ImageFilter.GaussianBlur(radius=1))


def test_hold_keeps_new_images_in_the_worker_until_one_must_leave(
    stack: Stack, worker: WorkerProcess, s3: Any
) -> None:
    img = picture()
    key = stack.put(worker, img)
    workflow = str(uuid.uuid4())
    common = {"workflow_id": workflow, "key": key}
    first = stack.run(worker, task="deblur", output_key=f"{key}-1", keep=True, hold=True, **common)
    assert first.status == "COMPLETED", first.error
    # Nothing written: the object it was computed from stays the worker's, and holds the input.
    assert (first.key, first.kept, first.held) == (key, True, True)
    assert (first.bytes_out, first.write_ms) == (required_size(64, 48, "RGB"), 0)
    assert stack.owner(key) == worker.worker_id and stack.owner(f"{key}-1") is None
    size = str(required_size(64, 48, "RGB"))
    poll(lambda: stack.held_beat(worker) == ("1", size), "the heartbeat to count the image")
    second = stack.run(
        worker,
        task="classify",
        output_key=f"{key}-2",
        keep=True,
        hold=True,
        held=str(first.task_run_id),
        **common,
    )
    assert second.status == "COMPLETED", second.error
    assert (second.key, second.held, second.output["label"]) == (key, True, "mixed")
    # The last task stores the result itself: its image never goes into an object, and the
    # base object is destroyed.
    result = f"worker-test/{uuid.uuid4().hex}.png"
    last = stack.run(
        worker,
        task="denoise",
        output_key=f"{key}-3",
        held=str(second.task_run_id),
        output_uri=f"s3://{BUCKET}/{result}",
        **common,
    )
    assert last.status == "COMPLETED", last.error
    assert (last.key, last.kept, last.held, last.stored) == ("", False, False, True)
    body = s3.get_object(Bucket=BUCKET, Key=result)["Body"].read()
    assert last.bytes_out == len(body)
    assert same_pixels(decode_bytes(body), _gaussian(unsharp(img)))
    for gone in (key, f"{key}-3"):
        with pytest.raises(cdi.ObjectNotFound):
            stack.sched.use(gone)
    poll(lambda: stack.held_beat(worker) == ("0", "0"), "the heartbeat to count none")


def test_a_held_input_the_worker_lacks_fails_so_the_scheduler_recomputes_it(
    stack: Stack, worker: WorkerProcess
) -> None:
    img = picture()
    key = stack.put(worker, img)
    report = stack.run(worker, task="denoise", key=key, output_key=f"{key}-1", held="12345")
    assert (report.status, report.held_lost, report.retryable) == ("FAILED", True, True)
    assert "holds no image from task run 12345" in report.error, report.error
    assert (report.key, report.kept) == (key, False)  # the older object comes back as it was
    assert same_pixels(stack.take_image(key), img)


def test_a_task_failing_on_a_held_input_writes_that_input_for_its_retry(
    stack: Stack, worker: WorkerProcess
) -> None:
    img = picture()
    key = stack.put(worker, img)
    common = {"workflow_id": str(uuid.uuid4()), "key": key, "keep": True, "hold": True}
    first = stack.run(worker, task="deblur", output_key=f"{key}-1", **common)
    assert first.held, first.error
    failed = stack.run(
        worker,
        task="tests.orchestrator.flaky_tasks:scribble_then_fail",
        output_key=f"{key}-2",
        held=str(first.task_run_id),
        **common,
    )
    assert failed.status == "FAILED" and "scribbling" in failed.error, failed.error
    # The retry starts from deblur's image, untouched by the failed attempt's scribbling.
    assert (failed.key, failed.kept, failed.held_lost) == (f"{key}-2", False, False)
    assert same_pixels(stack.take_image(f"{key}-2"), unsharp(img))
    with pytest.raises(cdi.ObjectNotFound):
        stack.sched.use(key)


def test_a_worker_with_no_hold_memory_writes_every_new_image(stack: Stack) -> None:
    writer = stack.start_worker("--hold-memory", "0")
    img = picture()
    key = stack.put(writer, img)
    report = stack.run(writer, task="deblur", key=key, output_key=f"{key}-1", keep=True, hold=True)
    assert report.status == "COMPLETED", report.error
    assert (report.key, report.kept, report.held) == (f"{key}-1", True, False)
    report = stack.run(writer, task="noop", key=f"{key}-1", output_key=f"{key}-2")
    assert report.status == "COMPLETED", report.error
    assert same_pixels(stack.take_image(f"{key}-1"), unsharp(img))
