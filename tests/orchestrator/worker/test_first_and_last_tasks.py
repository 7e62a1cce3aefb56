"""The ``cdi`` plane at a workflow's ends: the first task makes its object from the S3 input,
the last stores its result in S3; S3 within the policy, and a slow store that holds up nothing."""

from __future__ import annotations

import io
import signal
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from PIL import Image

import cdi
from cdi.link_emulator import Link, LinkProxy
from orchestrator.worker.worker import FINISH_AHEAD
from tests.orchestrator.worker.support import (
    BUCKET,
    SCHEDULER,
    Stack,
    WorkerProcess,
    picture,
    same_pixels,
    unsharp,
)
from workflows.imagebuf import decode_bytes, encode_image, required_size

SLOW_S3_RTT_S = 2.0  # an S3 call through the slow link takes at least this long


def _encoded(img: Image.Image, fmt: str) -> bytes:
    out = io.BytesIO()
    img.save(out, fmt)
    return out.getvalue()


@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])  # JPEG decodes straight into the object
def test_a_first_task_makes_the_object_from_its_s3_input(
    stack: Stack, worker: WorkerProcess, s3: Any, fmt: str
) -> None:
    data = _encoded(picture(), fmt)
    name = f"worker-test/in-{uuid.uuid4().hex}.{fmt.lower()}"
    s3.put_object(Bucket=BUCKET, Key=name, Body=data)
    key = f"obj-{uuid.uuid4().hex}"  # the worker creates it
    report = stack.run(worker, task="deblur", key=key, output_key=f"{key}-1",
                       input_uri=f"s3://{BUCKET}/{name}")  # fmt: skip
    assert report.status == "COMPLETED", report.error
    assert (report.key, report.kept) == (f"{key}-1", False)
    assert report.bytes_in == required_size(64, 48, "RGB") and report.read_ms > 0
    assert same_pixels(stack.take_image(f"{key}-1"), unsharp(decode_bytes(data)))
    with pytest.raises(cdi.ObjectNotFound):
        stack.sched.use(key)  # the input object, made and then destroyed by the worker


def test_a_first_task_that_only_reads_hands_back_the_object_it_made(
    stack: Stack, worker: WorkerProcess, s3: Any
) -> None:
    data = _encoded(picture(), "JPEG")
    name = f"worker-test/in-{uuid.uuid4().hex}.jpg"
    s3.put_object(Bucket=BUCKET, Key=name, Body=data)
    key = f"obj-{uuid.uuid4().hex}"
    report = stack.run(worker, task="classify", key=key, output_key=f"{key}-1",
                       input_uri=f"s3://{BUCKET}/{name}")  # fmt: skip
    assert (report.status, report.key, report.kept) == ("COMPLETED", key, False), report.error
    assert report.output["label"] and report.bytes_in == required_size(64, 48, "RGB")
    assert same_pixels(stack.take_image(key), decode_bytes(data))


def test_a_one_task_workflow_fetches_runs_and_stores_without_handing_anything_back(
    stack: Stack, worker: WorkerProcess, s3: Any
) -> None:
    img = picture()
    name = f"worker-test/in-{uuid.uuid4().hex}.png"
    s3.put_object(Bucket=BUCKET, Key=name, Body=_encoded(img, "PNG"))
    key, result = f"obj-{uuid.uuid4().hex}", f"worker-test/{uuid.uuid4().hex}.png"
    report = stack.run(worker, task="deblur", key=key, output_key=f"{key}-1",
                       input_uri=f"s3://{BUCKET}/{name}",
                       output_uri=f"s3://{BUCKET}/{result}")  # fmt: skip
    assert (report.status, report.stored, report.key) == ("COMPLETED", True, ""), report.error
    stored = Image.open(io.BytesIO(s3.get_object(Bucket=BUCKET, Key=result)["Body"].read()))
    assert same_pixels(stored.convert("RGB"), unsharp(img))
    for gone in (key, f"{key}-1"):
        assert stack.owner(gone) is None


def test_a_first_task_failing_after_its_fetch_hands_back_the_object_for_the_retry(
    stack: Stack, worker: WorkerProcess, s3: Any
) -> None:
    """The object is made before the task runs: a failed task hands it back intact (even one
    that scribbled on its input), and the retry starts from it with no second fetch."""
    data = _encoded(picture(), "PNG")
    name = f"worker-test/in-{uuid.uuid4().hex}.png"
    s3.put_object(Bucket=BUCKET, Key=name, Body=data)
    key = f"obj-{uuid.uuid4().hex}"
    scribble = "tests.orchestrator.flaky_tasks:scribble_then_fail"
    failed = stack.run(worker, task=scribble, key=key, output_key=f"{key}-1",
                       input_uri=f"s3://{BUCKET}/{name}")  # fmt: skip
    assert (failed.status, failed.retryable) == ("FAILED", True), failed.error
    assert (failed.key, failed.kept) == (key, False)
    assert stack.owner(key) == SCHEDULER
    stack.sched.use(key).transfer(worker.worker_id)  # the scheduler's retry, elsewhere or here
    retry = stack.run(worker, task="deblur", key=key, output_key=f"{key}-2", attempt=2)
    assert (retry.status, retry.key) == ("COMPLETED", f"{key}-2"), retry.error
    assert same_pixels(stack.take_image(f"{key}-2"), unsharp(decode_bytes(data)))


def _half_a_jpeg() -> bytes:
    whole = _encoded(picture(), "JPEG")
    return whole[: len(whole) // 2]


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (None, "does not exist"),
        (b"plain text, not a picture" * 8, "not a recognised image"),
        (_half_a_jpeg(), "corrupt or truncated"),  # fails mid-decode, in the object it made
    ],
    ids=["missing", "not-an-image", "truncated-jpeg"],
)
def test_a_first_task_whose_input_is_unusable_fails_for_good_and_leaves_no_object(
    stack: Stack, worker: WorkerProcess, s3: Any, content: bytes | None, reason: str
) -> None:
    name = f"worker-test/bad-{uuid.uuid4().hex}.jpg"
    if content is not None:
        s3.put_object(Bucket=BUCKET, Key=name, Body=content)
    uri, key = f"s3://{BUCKET}/{name}", f"obj-{uuid.uuid4().hex}"
    report = stack.run(worker, task="deblur", key=key, output_key=f"{key}-1", input_uri=uri)
    assert (report.status, report.retryable) == ("FAILED", False)
    assert reason in report.error and uri in report.error, report.error
    assert report.key == "", "there is no object to hand back: the retry fetches again"
    assert stack.owner(key) is None and stack.owner(f"{key}-1") is None
    assert worker.proc.poll() is None


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"input_uri": f"s3://{BUCKET}/in.png", "held": "7"}, "input_uri with held"),
        ({"input_uri": "/tmp/in.png"}, "input_uri: '/tmp/in.png'"),
    ],
)
def test_a_fetch_instruction_that_cannot_be_followed_is_refused_and_makes_no_object(
    stack: Stack, worker: WorkerProcess, fields: dict[str, Any], problem: str
) -> None:
    key = f"obj-{uuid.uuid4().hex}"
    report = stack.run(worker, task="noop", key=key, output_key=f"{key}-1", **fields)
    assert (report.status, report.retryable, report.key) == ("FAILED", False, "")
    assert problem in report.error, report.error
    assert stack.owner(key) is None


def test_a_last_task_that_only_reads_stores_its_input_as_asked(
    stack: Stack, worker: WorkerProcess, s3: Any
) -> None:
    dark = picture(40, 30)
    key = stack.put(worker, dark)
    result = f"worker-test/{uuid.uuid4().hex}.jpg"
    report = stack.run(worker, task="classify", key=key, output_key=f"{key}-out",
                       output_uri=f"s3://{BUCKET}/{result}", output_format="jpeg")  # fmt: skip
    assert (report.status, report.stored, report.key) == ("COMPLETED", True, ""), report.error
    assert report.output["label"]
    stored = s3.get_object(Bucket=BUCKET, Key=result)
    assert stored["ContentType"] == "image/jpeg"
    assert Image.open(io.BytesIO(stored["Body"].read())).size == (40, 30)
    for gone in (key, f"{key}-out"):
        with pytest.raises(cdi.ObjectNotFound):
            stack.sched.use(gone)


def test_a_result_s3_refuses_fails_the_task_and_keeps_its_input_for_the_retry(
    stack: Stack,
) -> None:
    # Results go to a bucket that does not exist: the policy allows it, S3 refuses it.
    bucket = f"no-such-bucket-{uuid.uuid4().hex[:8]}"
    worker = stack.start_worker(env={"CDIFLOW_S3_RESULTS": f"s3://{bucket}/"})
    img = picture()
    key = stack.put(worker, img)
    common = {"workflow_id": str(uuid.uuid4()), "key": key}
    first = stack.run(worker, task="deblur", output_key=f"{key}-1", keep=True, hold=True, **common)
    assert first.held, first.error
    nowhere = f"s3://{bucket}/result.png"
    last = stack.run(worker, task="denoise", output_key=f"{key}-2", held=str(first.task_run_id),
                     output_uri=nowhere, **common)  # fmt: skip
    assert (last.status, last.stored, last.retryable) == ("FAILED", False, True)
    assert nowhere in last.error, last.error
    # The retry starts from deblur's image, which was only in the worker's memory.
    assert (last.key, last.kept, last.held_lost) == (f"{key}-2", False, False)
    assert same_pixels(stack.take_image(f"{key}-2"), unsharp(img))
    with pytest.raises(cdi.ObjectNotFound):
        stack.sched.use(key)


@pytest.mark.parametrize(
    ("field", "uri"),
    [
        ("output_uri", "s3://cdiflow/elsewhere/result.png"),  # outside the results prefix
        ("output_uri", "s3://someone-else/result.png"),
        ("input_uri", "s3://someone-else/secret.png"),  # outside the inputs
        ("input_uri", "s3://cdiflow/in/../secret.png"),
    ],
)
def test_a_worker_reads_and_writes_s3_only_within_the_policy(
    stack: Stack, worker: WorkerProcess, s3: Any, field: str, uri: str
) -> None:
    """Whatever an instruction names (a forged one, a run stored before the policy): refused
    before the request, and for good."""
    prefix = f"worker-test/{uuid.uuid4().hex}"
    s3.put_object(Bucket=BUCKET, Key=f"{prefix}/in.png", Body=encode_image(picture(8, 8), "PNG"))
    fields = {"input_uri": f"s3://{BUCKET}/{prefix}/in.png",
              "output_uri": f"s3://{BUCKET}/{prefix}/out.png"} | {field: uri}  # fmt: skip
    report = stack.run(worker, task="noop", data_plane="object-store", **fields)
    assert (report.status, report.retryable) == ("FAILED", False), report.error
    assert uri in report.error or "'..' segment" in report.error, report.error


def test_a_slow_result_store_does_not_hold_up_the_workers_next_task(
    stack: Stack, s3_endpoint: str, s3: Any, tmp_path: Path
) -> None:
    """Storing a last task's result waits for S3; the worker's one slot goes on meanwhile."""
    target = urlsplit(s3_endpoint).netloc
    with LinkProxy(target, Link(mbit=None, rtt_ms=SLOW_S3_RTT_S * 1000), tmp_path) as slow_s3:
        worker = stack.start_worker(env={"S3_ENDPOINT_URL": slow_s3.url})
        img = picture()
        last_key, next_key = stack.put(worker, img), stack.put(worker, img)
        result = f"worker-test/{uuid.uuid4().hex}.png"
        last, _ = stack.send(worker, task="deblur", key=last_key, output_key=f"{last_key}-1",
                             output_uri=f"s3://{BUCKET}/{result}")  # fmt: skip
        following, _ = stack.send(worker, task="classify", key=next_key)
        # The task after it reports first, while the result is still on its way to S3.
        first = stack.report(following, worker)
        assert first.status == "COMPLETED", first.error
        assert not s3.list_objects_v2(Bucket=BUCKET, Prefix=result).get("Contents")
        stored = stack.report(last, worker)
        assert (stored.status, stored.stored) == ("COMPLETED", True), stored.error
        body = s3.get_object(Bucket=BUCKET, Key=result)["Body"].read()
        assert same_pixels(decode_bytes(body), unsharp(img))
        stack.take(next_key)

        # Stores pile up no further than FINISH_AHEAD: the third waits for one of the first two,
        # and the slot with it, so the quick task reports after one of them, before the third.
        reply_to = f"test-replies:{uuid.uuid4().hex}"
        sent = []
        for n in range(FINISH_AHEAD + 1):
            key = stack.put(worker, img)
            ins, _ = stack.send(worker, task="noop", key=key, reply_to=reply_to,
                                output_uri=f"s3://{BUCKET}/{result}-{n}")  # fmt: skip
            sent.append(ins.task_run_id)
        quick_key = stack.put(worker, img)
        quick, _ = stack.send(worker, task="classify", key=quick_key, reply_to=reply_to)
        reports = stack.reports(reply_to, FINISH_AHEAD + 2, worker)
        assert all(r.status == "COMPLETED" for r in reports), [r.error for r in reports]
        order = [r.task_run_id for r in reports]
        assert order[0] in sent[:FINISH_AHEAD], order
        assert order.index(quick.task_run_id) < order.index(sent[FINISH_AHEAD]), order
        stack.take(quick_key)
        worker.proc.send_signal(signal.SIGTERM)
        assert worker.wait() == 0, worker.log()


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"keep": True}, "output_uri with keep"),
        ({"output_format": "gif"}, "output_format 'gif' is not one of"),
        ({"output_uri": "http://example.com/x.png"}, "output_uri: 'http://example.com/x.png'"),
    ],
)
def test_a_result_instruction_that_cannot_be_followed_is_refused_with_a_reason(
    stack: Stack, worker: WorkerProcess, fields: dict[str, Any], problem: str
) -> None:
    img = picture(8, 8)
    key = stack.put(worker, img)
    asked = {"output_uri": f"s3://{BUCKET}/worker-test/never.png"} | fields
    report = stack.run(worker, task="noop", key=key, output_key=f"{key}-out", **asked)
    assert (report.status, report.retryable, report.stored) == ("FAILED", False, False)
    assert problem in report.error, report.error
    assert same_pixels(stack.take_image(key), img)
