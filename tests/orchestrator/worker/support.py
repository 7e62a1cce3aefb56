"""The worker tests' harness: the worker as a real process against real Redis, S3 and a CDI
minion, and the test as its scheduler.

The test registers the CDI container ``test-scheduler``, creates image objects, transfers them
to the worker, LPUSHes ``Instruction``s onto its queue and BRPOPs the ``Report``s, exactly as
the scheduler does. Workers use their own Redis database so no other suite's scheduler sees them.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis
from PIL import Image, ImageFilter

import cdi
from orchestrator.contract import keys
from orchestrator.contract.messages import Instruction, Report
from workflows.imagebuf import read_image, required_size, write_image

__all__ = [
    "BUCKET",
    "DEADLINE_S",
    "ROOT",
    "SCHEDULER",
    "WORKER_REDIS_DB",
    "Stack",
    "WorkerProcess",
    "as_text",
    "picture",
    "poll",
    "same_pixels",
    "unsharp",
]

ROOT = Path(__file__).resolve().parents[3]
SCHEDULER = "test-scheduler"
WORKER_REDIS_DB = 11  # the worker tests' own Redis database (the stack uses 0, the API tests 9)
BUCKET = "cdiflow"
DEADLINE_S = 60.0


def poll(check: Callable[[], Any], what: str, timeout: float = DEADLINE_S) -> Any:
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

    def start_worker(
        self, *args: str, env: dict[str, str] | None = None, worker_id: str = ""
    ) -> WorkerProcess:
        worker_id = worker_id or f"wt-{uuid.uuid4().hex[:10]}"
        own_env = self.env | (env or {})
        worker = WorkerProcess(worker_id, own_env, self.tmp / f"{worker_id}.log", *args)
        self.workers.append(worker)

        def ready() -> bool:
            if worker.proc.poll() is not None:
                pytest.fail(f"worker exited with {worker.proc.returncode}:\n{worker.log()}")
            return bool(self.redis.exists(keys.worker_key(worker_id)))

        poll(ready, f"the first heartbeat of {worker_id}")
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
        return as_text(images or b""), as_text(nbytes or b"")

    def owner(self, key: str) -> str | None:
        owners = {o["key"]: o["owner"] for o in self.sched.list_objects()}
        return owners.get(key)

    def send(self, worker: WorkerProcess, **fields: Any) -> tuple[Instruction, bytes]:
        ins = self.instruction(**fields)
        raw = ins.dumps()
        self.redis.lpush(keys.worker_queue_key(worker.worker_id), raw)
        return ins, raw

    @staticmethod
    def instruction(**fields: Any) -> Instruction:
        """An instruction with ``fields``, the rest made up (a new task run and reply list)."""
        defaults: dict[str, Any] = {
            "task_run_id": uuid.uuid4().int % 2**31, "workflow_id": str(uuid.uuid4()),
            "ref": "step", "attempt": 1, "timeout_s": 30.0, "data_plane": "cdi",
            "reply_to": f"test-replies:{uuid.uuid4().hex}", "return_to": SCHEDULER,
            "queued_at": time.time(),
        }  # fmt: skip
        return Instruction(**(defaults | fields))

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


def picture(width: int = 64, height: int = 48) -> Image.Image:
    """A textured RGB image, so sharpening actually changes pixels."""
    rng = np.random.default_rng(7)
    ys, xs = np.mgrid[0:height, 0:width]
    base = np.stack([xs * 4, ys * 5, (xs + ys) * 2], axis=-1) % 256
    noisy = base + rng.integers(-20, 21, size=base.shape)
    return Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8))


def unsharp(img: Image.Image) -> Image.Image:
    return img.filter(ImageFilter.UnsharpMask(radius=2, percent=150, threshold=3))


def as_text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def same_pixels(a: Image.Image, b: Image.Image) -> bool:
    return a.mode == b.mode and a.size == b.size and a.tobytes() == b.tobytes()
