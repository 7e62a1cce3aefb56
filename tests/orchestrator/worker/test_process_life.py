"""The worker process's life: timeouts, SIGKILL and SIGTERM mid-task, concurrency, a missing
minion, dropped Redis connections, an instruction sent twice."""

from __future__ import annotations

import signal
import subprocess
import sys

from orchestrator.contract import keys
from tests.orchestrator.worker.support import (
    DEADLINE_S,
    ROOT,
    Stack,
    WorkerProcess,
    picture,
    poll,
    same_pixels,
)


def test_a_timed_out_task_is_reported_and_the_worker_exits_non_zero(stack: Stack) -> None:
    worker = stack.start_worker()
    img = picture(8, 8)
    key = stack.put(worker, img)
    report = stack.run(worker, task="sleep", params={"ms": 5000}, timeout_s=0.2, key=key, keep=True)
    assert (report.status, report.retryable) == ("TIMED_OUT", True)
    assert (report.key, report.kept) == (key, False)  # handed back despite keep: it exits
    assert same_pixels(stack.take_image(key), img)
    assert worker.wait() != 0, worker.log()
    assert "timeout" in worker.log()


def test_sigkill_mid_task_leaves_it_in_flight_and_the_object_comes_back(stack: Stack) -> None:
    worker = stack.start_worker()
    img = picture(16, 16)
    key = stack.put(worker, img)
    _, raw = stack.send(
        worker, task="sleep", params={"ms": 60_000}, timeout_s=120, key=key, output_key="x"
    )
    beat = keys.worker_key(worker.worker_id)
    poll(lambda: stack.redis.hget(beat, "running") == b"1", "the task to be running")
    worker.proc.send_signal(signal.SIGKILL)
    assert worker.wait() == -signal.SIGKILL
    assert stack.redis.lrange(keys.worker_inflight_key(worker.worker_id), 0, -1) == [raw.encode()]
    assert same_pixels(stack.take_image(key), img)


def test_sigterm_finishes_the_current_task_then_exits_zero(stack: Stack) -> None:
    worker = stack.start_worker()
    key = stack.put(worker, picture(8, 8))
    ins, _ = stack.send(worker, task="sleep", params={"ms": 500}, key=key)
    queue = keys.worker_queue_key(worker.worker_id)
    inflight = keys.worker_inflight_key(worker.worker_id)
    poll(lambda: stack.redis.llen(queue) == 0 and stack.redis.llen(inflight) == 1, "the pop")
    worker.proc.send_signal(signal.SIGTERM)
    assert stack.report(ins, worker).status == "COMPLETED"
    assert worker.wait() == 0, worker.log()
    assert not stack.redis.exists(keys.worker_key(worker.worker_id))
    assert stack.redis.llen(inflight) == 0
    stack.take(key)


def test_concurrency_runs_instructions_side_by_side(stack: Stack) -> None:
    worker = stack.start_worker("--concurrency", "2")
    pictures = [picture(8, 8), picture(9, 9)]
    objects = [stack.put(worker, img) for img in pictures]
    sent = [(stack.send(worker, task="sleep", params={"ms": 3000}, key=k)[0], k) for k in objects]
    # One slot acknowledges before it pops again: two in flight means two slots at work.
    inflight = keys.worker_inflight_key(worker.worker_id)
    poll(lambda: stack.redis.llen(inflight) == 2, "both instructions in flight")
    for (ins, key), img in zip(sent, pictures, strict=True):
        assert stack.report(ins, worker).status == "COMPLETED"
        assert same_pixels(stack.take_image(key), img)


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
    key = stack.put(worker, picture(8, 8))
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
    key = stack.put(worker, picture())
    ins, raw = stack.send(worker, task="deblur", key=key, output_key=f"{key}-1")
    first = stack.report(ins, worker)
    assert first.status == "COMPLETED", first.error
    stack.redis.lpush(keys.worker_queue_key(worker.worker_id), raw)  # the same, again
    again = stack.report(ins, worker)
    assert again == first
    assert stack.redis.llen(keys.worker_inflight_key(worker.worker_id)) == 0
    stack.take(f"{key}-1")  # one output object, made once
