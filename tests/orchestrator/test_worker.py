"""The worker as a real process against real Redis, S3 and a CDI minion; the test is the scheduler.

The test registers the CDI container ``test-scheduler``, creates image objects, transfers them
to the worker, LPUSHes ``Instruction``s onto its queue and BRPOPs the ``Report``s, exactly as
the scheduler does. Workers use their own Redis database so no other suite's scheduler sees them.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import boto3
import numpy as np
import pytest
import redis
from PIL import Image, ImageFilter

import cdi
from cdi.minion.process import MinionChild
from loadtest.netem_proxy import LinkSpec, NetemProxy
from orchestrator.contract import keys
from orchestrator.contract.messages import Instruction, Report
from orchestrator.worker.worker import FINISH_AHEAD
from workflows.imagebuf import decode_bytes, encode_image, read_image, required_size, write_image

ROOT = Path(__file__).resolve().parents[2]
SCHEDULER = "test-scheduler"
WORKER_REDIS_DB = 11  # the worker tests' own Redis database (the stack uses 0, the API tests 9)
BUCKET = "cdiflow"
DEADLINE_S = 60.0
SLOW_S3_RTT_S = 2.0  # an S3 call through the slow link takes at least this long


def _poll(check: Callable[[], Any], what: str, timeout: float = DEADLINE_S) -> Any:
    """``check()``'s first truthy result; fail naming ``what`` when the deadline passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := check():
            return result
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")


class WorkerProcess:
    """``python -m orchestrator.worker`` as a child process, stopped by PID only."""

    def __init__(self, worker_id: str, env: dict[str, str], log_path: Path, *args: str) -> None:
        self.worker_id = worker_id
        self.log_path = log_path
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "orchestrator.worker", "--id", worker_id, *args],
                env=env,
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def wait(self, timeout: float = DEADLINE_S) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"worker {self.worker_id} did not exit; log:\n{self.log()}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class Stack:
    """What a test needs: the scheduler's CDI client, Redis, S3, and a way to start workers."""

    def __init__(self, env: dict[str, str], r: redis.Redis, sched: cdi.Client, tmp: Path) -> None:
        self.env, self.redis, self.sched, self.tmp = env, r, sched, tmp
        self.workers: list[WorkerProcess] = []

    def start_worker(self, *args: str, env: dict[str, str] | None = None) -> WorkerProcess:
        worker_id = f"wt-{uuid.uuid4().hex[:10]}"
        own_env = self.env | (env or {})
        worker = WorkerProcess(worker_id, own_env, self.tmp / f"{worker_id}.log", *args)
        self.workers.append(worker)

        def ready() -> bool:
            if worker.proc.poll() is not None:
                pytest.fail(f"worker exited with {worker.proc.returncode}:\n{worker.log()}")
            return bool(self.redis.exists(keys.worker_key(worker_id)))

        _poll(ready, f"the first heartbeat of {worker_id}")
        return worker

    def put(self, worker: WorkerProcess, content: Image.Image | bytes) -> str:
        """A new object holding an image (or raw bytes), transferred to ``worker``."""
        if isinstance(content, Image.Image):
            buf = bytearray(required_size(content.width, content.height, content.mode))
            write_image(memoryview(buf), content)
            content = bytes(buf)
        key = f"obj-{uuid.uuid4().hex}"
        obj = self.sched.create(key, len(content))
        obj.write(content)
        obj.transfer(worker.worker_id)
        return key

    def take(self, key: str) -> bytes:
        """Wait until ``key`` is the scheduler's again; return its bytes and destroy it."""
        obj = self.sched.use(key)
        obj.access(timeout=DEADLINE_S).release()
        data = bytes(obj.read())
        obj.destroy()
        return data

    def take_image(self, key: str) -> Image.Image:
        return read_image(memoryview(bytearray(self.take(key))))

    def held_beat(self, worker: WorkerProcess) -> tuple[str, str]:
        """The images and bytes the worker's heartbeat says it holds."""
        key = keys.worker_key(worker.worker_id)
        images, nbytes = self.redis.hmget(key, ["held_images", "held_bytes"])
        return _text(images or b""), _text(nbytes or b"")

    def owner(self, key: str) -> str | None:
        owners = {o["key"]: o["owner"] for o in self.sched.list_objects()}
        return owners.get(key)

    def send(self, worker: WorkerProcess, **fields: Any) -> tuple[Instruction, str]:
        defaults: dict[str, Any] = {
            "task_run_id": uuid.uuid4().int % 2**31, "workflow_id": str(uuid.uuid4()),
            "ref": "step", "attempt": 1, "timeout_s": 30.0, "data_plane": "cdi",
            "reply_to": f"test-replies:{uuid.uuid4().hex}", "return_to": SCHEDULER,
            "queued_at": time.time(),
        }  # fmt: skip
        ins = Instruction(**(defaults | fields))
        raw = ins.dumps()
        self.redis.lpush(keys.worker_queue_key(worker.worker_id), raw)
        return ins, raw

    def report(self, ins: Instruction, worker: WorkerProcess) -> Report:
        popped = self.redis.brpop([ins.reply_to], timeout=DEADLINE_S)
        if popped is None:
            pytest.fail(f"no report for {ins.task_run_id}; worker log:\n{worker.log()}")
        report = Report.loads(popped[1])
        assert (report.task_run_id, report.worker_id) == (ins.task_run_id, worker.worker_id)
        return report

    def reports(self, reply_to: str, count: int, worker: WorkerProcess) -> list[Report]:
        """The next ``count`` reports on ``reply_to``, in the order they came."""
        got: list[Report] = []
        for _ in range(count):
            popped = self.redis.brpop([reply_to], timeout=DEADLINE_S)
            if popped is None:
                pytest.fail(f"{len(got)} of {count} reports came; worker log:\n{worker.log()}")
            got.append(Report.loads(popped[1]))
        return got

    def run(self, worker: WorkerProcess, **fields: Any) -> Report:
        ins, _ = self.send(worker, **fields)
        return self.report(ins, worker)


@pytest.fixture(scope="module")
def stack(redis_url: str, s3_endpoint: str, s3_keys: tuple[str, str]) -> Iterator[Stack]:
    with tempfile.TemporaryDirectory(prefix="cdiflow-worker-test-") as name:
        os.chmod(name, 0o755)  # the minion's socket folder, traversable like in production
        tmp = Path(name)
        minion = MinionChild(str(tmp / "minion.sock")).start()
        db_url = urlunsplit(urlsplit(redis_url)._replace(path=f"/{WORKER_REDIS_DB}"))
        r = redis.Redis.from_url(db_url)
        r.flushdb()
        sched = cdi.connect(minion.socket_path, SCHEDULER)
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CDI_SOCKET")}
        env |= {
            "CDI_URL": f"unix://{minion.socket_path}", "REDIS_URL": db_url,
            "S3_ENDPOINT_URL": s3_endpoint, "S3_BUCKET": BUCKET, "AWS_REGION": "us-east-1",
            "AWS_ACCESS_KEY_ID": s3_keys[0], "AWS_SECRET_ACCESS_KEY": s3_keys[1],
            "CDIFLOW_DATA_DIR": str(tmp / "data"),
            "CDIFLOW_TASK_PACKAGES": "workflows,tests.orchestrator",
            # The tests' results and in-between images go under worker-test/.
            "CDIFLOW_S3_RESULTS": f"s3://{BUCKET}/worker-test/",
        }  # fmt: skip
        running = Stack(env, r, sched, tmp)
        try:
            yield running
            for worker in running.workers:
                if worker.proc.poll() is None:
                    worker.proc.send_signal(signal.SIGTERM)
                    assert worker.wait() == 0, worker.log()
            # Every object came back to the scheduler and was destroyed by the tests.
            assert sched.list_objects() == []
        finally:
            for worker in running.workers:
                worker.kill()
            sched.close()
            r.flushdb()
            r.close()
            minion.stop()


@pytest.fixture(scope="module")
def worker(stack: Stack) -> WorkerProcess:
    """A worker shared by the tests that leave it running."""
    return stack.start_worker()


@pytest.fixture(scope="module")
def s3(s3_endpoint: str, s3_keys: tuple[str, str]) -> Any:
    return boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1",
                        aws_access_key_id=s3_keys[0], aws_secret_access_key=s3_keys[1])  # fmt: skip


def _picture(width: int = 64, height: int = 48) -> Image.Image:
    """A textured RGB image, so sharpening actually changes pixels."""
    rng = np.random.default_rng(7)
    ys, xs = np.mgrid[0:height, 0:width]
    base = np.stack([xs * 4, ys * 5, (xs + ys) * 2], axis=-1) % 256
    noisy = base + rng.integers(-20, 21, size=base.shape)
    return Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8))


def _unsharp(img: Image.Image) -> Image.Image:
    return img.filter(ImageFilter.UnsharpMask(radius=2, percent=150, threshold=3))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _same_pixels(a: Image.Image, b: Image.Image) -> bool:
    return a.mode == b.mode and a.size == b.size and a.tobytes() == b.tobytes()


# --------------------------------------------------------------------------- cdi plane
def test_deblur_gives_a_new_object_with_unsharp_pixels(stack: Stack, worker: WorkerProcess) -> None:
    img = _picture()
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
    assert _same_pixels(result, _unsharp(img))
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


def _encoded(img: Image.Image, fmt: str) -> bytes:
    out = io.BytesIO()
    img.save(out, fmt)
    return out.getvalue()


@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])  # JPEG decodes straight into the object
def test_a_first_task_makes_the_object_from_its_s3_input(
    stack: Stack, worker: WorkerProcess, s3: Any, fmt: str
) -> None:
    data = _encoded(_picture(), fmt)
    name = f"worker-test/in-{uuid.uuid4().hex}.{fmt.lower()}"
    s3.put_object(Bucket=BUCKET, Key=name, Body=data)
    key = f"obj-{uuid.uuid4().hex}"  # the worker creates it
    report = stack.run(worker, task="deblur", key=key, output_key=f"{key}-1",
                       input_uri=f"s3://{BUCKET}/{name}")  # fmt: skip
    assert report.status == "COMPLETED", report.error
    assert (report.key, report.kept) == (f"{key}-1", False)
    assert report.bytes_in == required_size(64, 48, "RGB") and report.read_ms > 0
    assert _same_pixels(stack.take_image(f"{key}-1"), _unsharp(decode_bytes(data)))
    with pytest.raises(cdi.ObjectNotFound):
        stack.sched.use(key)  # the input object, made and then destroyed by the worker


def test_a_first_task_that_only_reads_hands_back_the_object_it_made(
    stack: Stack, worker: WorkerProcess, s3: Any
) -> None:
    data = _encoded(_picture(), "JPEG")
    name = f"worker-test/in-{uuid.uuid4().hex}.jpg"
    s3.put_object(Bucket=BUCKET, Key=name, Body=data)
    key = f"obj-{uuid.uuid4().hex}"
    report = stack.run(worker, task="classify", key=key, output_key=f"{key}-1",
                       input_uri=f"s3://{BUCKET}/{name}")  # fmt: skip
    assert (report.status, report.key, report.kept) == ("COMPLETED", key, False), report.error
    assert report.output["label"] and report.bytes_in == required_size(64, 48, "RGB")
    assert _same_pixels(stack.take_image(key), decode_bytes(data))


def test_a_one_task_workflow_fetches_runs_and_stores_without_handing_anything_back(
    stack: Stack, worker: WorkerProcess, s3: Any
) -> None:
    img = _picture()
    name = f"worker-test/in-{uuid.uuid4().hex}.png"
    s3.put_object(Bucket=BUCKET, Key=name, Body=_encoded(img, "PNG"))
    key, result = f"obj-{uuid.uuid4().hex}", f"worker-test/{uuid.uuid4().hex}.png"
    report = stack.run(worker, task="deblur", key=key, output_key=f"{key}-1",
                       input_uri=f"s3://{BUCKET}/{name}",
                       output_uri=f"s3://{BUCKET}/{result}")  # fmt: skip
    assert (report.status, report.stored, report.key) == ("COMPLETED", True, ""), report.error
    stored = Image.open(io.BytesIO(s3.get_object(Bucket=BUCKET, Key=result)["Body"].read()))
    assert _same_pixels(stored.convert("RGB"), _unsharp(img))
    for gone in (key, f"{key}-1"):
        assert stack.owner(gone) is None


def test_a_first_task_failing_after_its_fetch_hands_back_the_object_for_the_retry(
    stack: Stack, worker: WorkerProcess, s3: Any
) -> None:
    """The object is made before the task runs: a failed task hands it back intact (even one
    that scribbled on its input), and the retry starts from it with no second fetch."""
    data = _encoded(_picture(), "PNG")
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
    assert _same_pixels(stack.take_image(f"{key}-2"), _unsharp(decode_bytes(data)))


def _half_a_jpeg() -> bytes:
    whole = _encoded(_picture(), "JPEG")
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


def test_keep_leaves_the_object_with_the_worker(stack: Stack, worker: WorkerProcess) -> None:
    key = stack.put(worker, _picture())
    report = stack.run(worker, task="denoise", key=key, output_key=f"{key}-1", keep=True)
    assert report.status == "COMPLETED", report.error
    assert (report.key, report.kept) == (f"{key}-1", True)
    assert stack.owner(f"{key}-1") == worker.worker_id
    # The next task comes to the same worker, which already owns it, and hands it back.
    report = stack.run(worker, task="noop", key=f"{key}-1", output_key=f"{key}-2")
    assert report.status == "COMPLETED", report.error
    assert (report.key, report.kept, report.bytes_out) == (f"{key}-1", False, 0)
    stack.take(f"{key}-1")


def _gaussian(img: Image.Image) -> Image.Image:
    return img.filter(ImageFilter.GaussianBlur(radius=1))


def test_hold_keeps_new_images_in_the_worker_until_one_must_leave(
    stack: Stack, worker: WorkerProcess, s3: Any
) -> None:
    img = _picture()
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
    _poll(lambda: stack.held_beat(worker) == ("1", size), "the heartbeat to count the image")
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
    assert _same_pixels(decode_bytes(body), _gaussian(_unsharp(img)))
    for gone in (key, f"{key}-3"):
        with pytest.raises(cdi.ObjectNotFound):
            stack.sched.use(gone)
    _poll(lambda: stack.held_beat(worker) == ("0", "0"), "the heartbeat to count none")


def test_a_last_task_that_only_reads_stores_its_input_as_asked(
    stack: Stack, worker: WorkerProcess, s3: Any
) -> None:
    dark = _picture(40, 30)
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
    img = _picture()
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
    assert _same_pixels(stack.take_image(f"{key}-2"), _unsharp(img))
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
    s3.put_object(Bucket=BUCKET, Key=f"{prefix}/in.png", Body=encode_image(_picture(8, 8), "PNG"))
    fields = {"input_uri": f"s3://{BUCKET}/{prefix}/in.png",
              "output_uri": f"s3://{BUCKET}/{prefix}/out.png"} | {field: uri}  # fmt: skip
    report = stack.run(worker, task="noop", data_plane="object-store", **fields)
    assert (report.status, report.retryable) == ("FAILED", False), report.error
    assert uri in report.error or "'..' segment" in report.error, report.error


def test_a_slow_result_store_does_not_hold_up_the_workers_next_task(
    stack: Stack, s3_endpoint: str, s3: Any
) -> None:
    """Storing a last task's result waits for S3; the worker's one slot goes on meanwhile."""
    target = urlsplit(s3_endpoint).netloc
    with NetemProxy(target, LinkSpec(rtt_s=SLOW_S3_RTT_S)) as slow_s3:
        worker = stack.start_worker(env={"S3_ENDPOINT_URL": slow_s3.url})
        img = _picture()
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
        assert _same_pixels(decode_bytes(body), _unsharp(img))
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
    img = _picture(8, 8)
    key = stack.put(worker, img)
    asked = {"output_uri": f"s3://{BUCKET}/worker-test/never.png"} | fields
    report = stack.run(worker, task="noop", key=key, output_key=f"{key}-out", **asked)
    assert (report.status, report.retryable, report.stored) == ("FAILED", False, False)
    assert problem in report.error, report.error
    assert _same_pixels(stack.take_image(key), img)


def test_a_held_input_the_worker_lacks_fails_so_the_scheduler_recomputes_it(
    stack: Stack, worker: WorkerProcess
) -> None:
    img = _picture()
    key = stack.put(worker, img)
    report = stack.run(worker, task="denoise", key=key, output_key=f"{key}-1", held="12345")
    assert (report.status, report.held_lost, report.retryable) == ("FAILED", True, True)
    assert "holds no image from task run 12345" in report.error, report.error
    assert (report.key, report.kept) == (key, False)  # the older object comes back as it was
    assert _same_pixels(stack.take_image(key), img)


def test_a_task_failing_on_a_held_input_writes_that_input_for_its_retry(
    stack: Stack, worker: WorkerProcess
) -> None:
    img = _picture()
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
    assert _same_pixels(stack.take_image(f"{key}-2"), _unsharp(img))
    with pytest.raises(cdi.ObjectNotFound):
        stack.sched.use(key)


def test_a_worker_with_no_hold_memory_writes_every_new_image(stack: Stack) -> None:
    writer = stack.start_worker("--hold-memory", "0")
    img = _picture()
    key = stack.put(writer, img)
    report = stack.run(writer, task="deblur", key=key, output_key=f"{key}-1", keep=True, hold=True)
    assert report.status == "COMPLETED", report.error
    assert (report.key, report.kept, report.held) == (f"{key}-1", True, False)
    report = stack.run(writer, task="noop", key=f"{key}-1", output_key=f"{key}-2")
    assert report.status == "COMPLETED", report.error
    assert _same_pixels(stack.take_image(f"{key}-1"), _unsharp(img))


def test_classify_reports_a_label_on_the_same_object(stack: Stack, worker: WorkerProcess) -> None:
    dark = Image.new("RGB", (32, 32), (10, 20, 30))
    key = stack.put(worker, dark)
    report = stack.run(worker, task="classify", key=key, output_key=f"{key}-out")
    assert report.status == "COMPLETED", report.error
    assert report.output["label"] == "dark"
    assert report.key == key  # no new image: the input is the current object
    result = stack.take_image(key)
    assert _same_pixels(result, dark)


def test_a_non_image_fails_for_good_comes_back_intact(stack: Stack, worker: WorkerProcess) -> None:
    junk = b"this is not an image at all, just some bytes" * 4
    key = stack.put(worker, junk)
    report = stack.run(worker, task="deblur", key=key, output_key=f"{key}-out")
    assert (report.status, report.retryable) == ("FAILED", False)
    assert key in report.error and "image" in report.error
    assert (report.key, report.kept) == (key, False)
    assert stack.take(key) == junk
    assert stack.owner(f"{key}-out") is None


def test_an_unknown_task_fails_and_hands_input_back(stack: Stack, worker: WorkerProcess) -> None:
    img = _picture(8, 8)
    key = stack.put(worker, img)
    report = stack.run(worker, task="no-such-task", key=key, output_key=f"{key}-out")
    assert (report.status, report.retryable) == ("FAILED", False)
    assert "no-such-task" in report.error
    assert _same_pixels(stack.take_image(key), img)


@pytest.mark.parametrize(
    ("task", "says"),
    [
        ("builtins:print", "not in a package tasks may come from"),
        ("builtins:exec", "not in a package tasks may come from"),
        ("os:system", "not in a package tasks may come from"),
        ("subprocess:run", "not in a package tasks may come from"),
        ("tests.orchestrator.flaky_tasks:not_a_task", "without @task"),
        ("tests.orchestrator.flaky_tasks:shell", "without @task"),
    ],
)
def test_a_worker_runs_no_callable_but_deployed_task_functions(
    stack: Stack, worker: WorkerProcess, task: str, says: str
) -> None:
    """An instruction naming any other callable (a stale definition, a forged instruction)
    fails for good without running it, and the input comes back intact."""
    img = _picture(8, 8)
    key = stack.put(worker, img)
    report = stack.run(worker, task=task, key=key, output_key=f"{key}-out")
    assert (report.status, report.retryable) == ("FAILED", False), report.error
    assert says in report.error and task in report.error
    assert _same_pixels(stack.take_image(key), img)
    assert "ran as a task" not in worker.log()


def test_poison_messages_do_not_stop_the_loop(stack: Stack, worker: WorkerProcess) -> None:
    queue = keys.worker_queue_key(worker.worker_id)
    stack.redis.lpush(queue, b"\xff not json")
    stack.redis.lpush(queue, b'{"reply_to": "x"}')
    # Parsable, but on a plane nobody knows: a report, not retryable.
    report = stack.run(worker, task="noop", data_plane="ftp")
    assert (report.status, report.retryable) == ("FAILED", False)
    assert "data_plane" in report.error
    # The loop still runs, and nothing stays in flight.
    key = stack.put(worker, _picture(8, 8))
    assert stack.run(worker, task="noop", key=key).status == "COMPLETED"
    stack.take(key)
    assert stack.redis.llen(keys.worker_inflight_key(worker.worker_id)) == 0


def test_a_report_redis_refuses_is_dropped_and_acknowledged(
    stack: Stack, worker: WorkerProcess
) -> None:
    """A report list that is not a list (WRONGTYPE): nothing to retry, nothing left in flight."""
    key = stack.put(worker, _picture(8, 8))
    reply_to = f"test-string:{uuid.uuid4().hex}"
    stack.redis.set(reply_to, "not a list")
    stack.send(worker, task="noop", key=key, reply_to=reply_to)
    inflight = keys.worker_inflight_key(worker.worker_id)
    _poll(lambda: stack.owner(key) == SCHEDULER, "the object's return")
    _poll(lambda: stack.redis.llen(inflight) == 0, "the acknowledgement")
    assert stack.redis.get(reply_to) == b"not a list"
    assert "refused the report" in worker.log()
    stack.take(key)
    # The loop still runs.
    again = stack.put(worker, _picture(8, 8))
    assert stack.run(worker, task="noop", key=again).status == "COMPLETED"
    stack.take(again)


def test_heartbeat_has_every_field(stack: Stack, worker: WorkerProcess) -> None:
    key = keys.worker_key(worker.worker_id)
    beat = {_text(k): _text(v) for k, v in stack.redis.hgetall(key).items()}
    assert set(beat) == set(keys.WORKER_FIELDS) and beat["slots"] == "1"
    assert 0 <= float(beat["cpu"]) <= 100 and 0 < float(beat["mem"]) <= 100
    assert int(beat["queue_depth"]) >= 0 and int(beat["running"]) >= 0 and beat["host"]
    assert float(beat["started_at"]) <= float(beat["last_heartbeat"])
    assert int(beat["held_images"]) >= 0 and int(beat["held_bytes"]) >= 0
    assert stack.redis.sismember(keys.WORKERS, worker.worker_id)
    assert 0 < stack.redis.ttl(key) <= 10 * keys.HEARTBEAT_INTERVAL_S
    # It is refreshed.
    first = float(beat["last_heartbeat"])
    _poll(lambda: float(stack.redis.hget(key, "last_heartbeat") or 0) > first, "a new heartbeat")


# --------------------------------------------------------------------------- object-store plane
def test_object_store_plane_gets_runs_and_puts(
    stack: Stack, worker: WorkerProcess, s3: Any
) -> None:
    img = _picture()
    prefix = f"worker-test/{uuid.uuid4().hex}"
    encoded = encode_image(img, "PNG")
    s3.put_object(Bucket=BUCKET, Key=f"{prefix}/in.png", Body=encoded)
    for task, expected in (("deblur", _unsharp(img)), ("classify", img)):
        report = stack.run(worker, task=task, data_plane="object-store",
                           input_uri=f"s3://{BUCKET}/{prefix}/in.png",
                           output_uri=f"s3://{BUCKET}/{prefix}/{task}.png")  # fmt: skip
        assert report.status == "COMPLETED", report.error
        body = s3.get_object(Bucket=BUCKET, Key=f"{prefix}/{task}.png")["Body"].read()
        assert _same_pixels(decode_bytes(body), expected)
        assert (report.bytes_in, report.bytes_out) == (len(encoded), len(body))
    assert report.output["label"]
    missing = f"s3://{BUCKET}/{prefix}/missing.png"
    report = stack.run(worker, task="deblur", data_plane="object-store", input_uri=missing,
                       output_uri=f"s3://{BUCKET}/{prefix}/out.png")  # fmt: skip
    assert (report.status, report.retryable) == ("FAILED", False)
    assert missing in report.error


# --------------------------------------------------------------------------- process life
def test_a_timed_out_task_is_reported_and_the_worker_exits_non_zero(stack: Stack) -> None:
    worker = stack.start_worker()
    img = _picture(8, 8)
    key = stack.put(worker, img)
    report = stack.run(worker, task="sleep", params={"ms": 5000}, timeout_s=0.2, key=key, keep=True)
    assert (report.status, report.retryable) == ("TIMED_OUT", True)
    assert (report.key, report.kept) == (key, False)  # handed back despite keep: it exits
    assert _same_pixels(stack.take_image(key), img)
    assert worker.wait() != 0, worker.log()
    assert "timeout" in worker.log()


def test_sigkill_mid_task_leaves_it_in_flight_and_the_object_comes_back(stack: Stack) -> None:
    worker = stack.start_worker()
    img = _picture(16, 16)
    key = stack.put(worker, img)
    _, raw = stack.send(
        worker, task="sleep", params={"ms": 60_000}, timeout_s=120, key=key, output_key="x"
    )
    beat = keys.worker_key(worker.worker_id)
    _poll(lambda: stack.redis.hget(beat, "running") == b"1", "the task to be running")
    worker.proc.send_signal(signal.SIGKILL)
    assert worker.wait() == -signal.SIGKILL
    assert stack.redis.lrange(keys.worker_inflight_key(worker.worker_id), 0, -1) == [raw.encode()]
    assert _same_pixels(stack.take_image(key), img)


def test_sigterm_finishes_the_current_task_then_exits_zero(stack: Stack) -> None:
    worker = stack.start_worker()
    key = stack.put(worker, _picture(8, 8))
    ins, _ = stack.send(worker, task="sleep", params={"ms": 500}, key=key)
    queue = keys.worker_queue_key(worker.worker_id)
    inflight = keys.worker_inflight_key(worker.worker_id)
    _poll(lambda: stack.redis.llen(queue) == 0 and stack.redis.llen(inflight) == 1, "the pop")
    worker.proc.send_signal(signal.SIGTERM)
    assert stack.report(ins, worker).status == "COMPLETED"
    assert worker.wait() == 0, worker.log()
    assert not stack.redis.exists(keys.worker_key(worker.worker_id))
    assert stack.redis.llen(inflight) == 0
    stack.take(key)


def test_concurrency_runs_instructions_side_by_side(stack: Stack) -> None:
    worker = stack.start_worker("--concurrency", "2")
    pictures = [_picture(8, 8), _picture(9, 9)]
    objects = [stack.put(worker, img) for img in pictures]
    sent = [(stack.send(worker, task="sleep", params={"ms": 3000}, key=k)[0], k) for k in objects]
    # One slot acknowledges before it pops again: two in flight means two slots at work.
    inflight = keys.worker_inflight_key(worker.worker_id)
    _poll(lambda: stack.redis.llen(inflight) == 2, "both instructions in flight")
    for (ins, key), img in zip(sent, pictures, strict=True):
        assert stack.report(ins, worker).status == "COMPLETED"
        assert _same_pixels(stack.take_image(key), img)


def test_no_minion_is_a_clear_startup_error(stack: Stack) -> None:
    missing = stack.tmp / "nowhere" / "minion.sock"
    env = stack.env | {"CDI_URL": f"unix://{missing}"}
    argv = [sys.executable, "-m", "orchestrator.worker", "--id", "wt-nominion"]
    result = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True,
                            timeout=DEADLINE_S, check=False)  # fmt: skip
    assert result.returncode == 1
    assert "no CDI minion is listening" in result.stderr and "CDI_URL" in result.stderr
    assert stack.redis.exists(keys.worker_key("wt-nominion")) == 0


def test_a_worker_whose_redis_connections_drop_runs_the_next_task(
    stack: Stack, worker: WorkerProcess
) -> None:
    """Each slot keeps a Redis connection of its own; when Redis drops them all (a restart, a
    failover), the slot's blocked pop fails, and it connects again and goes on."""
    logged = len(worker.log_path.read_text(errors="replace"))
    dropped = stack.redis.client_kill_filter(_type="normal", skipme=True)
    assert dropped >= 1
    key = stack.put(worker, _picture(8, 8))
    assert stack.run(worker, task="noop", key=key).status == "COMPLETED"
    stack.take(key)
    since = worker.log_path.read_text(errors="replace")[logged:]
    assert "cannot pop" in since, since  # the slot did see its connection go


def test_an_instruction_sent_again_is_answered_with_its_report_not_run_twice(
    stack: Stack, worker: WorkerProcess
) -> None:
    """A scheduler sends an instruction again when its report may be lost (Redis lost its
    data): the first run handed the object on, so running it again would fail or compute on
    the wrong input. The worker answers the repeat with the report it sent."""
    key = stack.put(worker, _picture())
    ins, raw = stack.send(worker, task="deblur", key=key, output_key=f"{key}-1")
    first = stack.report(ins, worker)
    assert first.status == "COMPLETED", first.error
    stack.redis.lpush(keys.worker_queue_key(worker.worker_id), raw)  # the same, again
    again = stack.report(ins, worker)
    assert again == first
    assert stack.redis.llen(keys.worker_inflight_key(worker.worker_id)) == 0
    stack.take(f"{key}-1")  # one output object, made once
