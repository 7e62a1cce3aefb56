"""What a worker runs and what it answers: task outcomes, deployed task functions only, messages
it cannot read, a report Redis refuses, and its heartbeat."""

from __future__ import annotations

import uuid

import pytest
from PIL import Image

from orchestrator.contract import keys
from tests.orchestrator.worker.support import (
    SCHEDULER,
    Stack,
    WorkerProcess,
    as_text,
    picture,
    poll,
    same_pixels,
)


def test_classify_reports_a_label_on_the_same_object(stack: Stack, worker: WorkerProcess) -> None:
    dark = Image.new("RGB", (32, 32), (10, 20, 30))
    key = stack.put(worker, dark)
    report = stack.run(worker, task="classify", key=key, output_key=f"{key}-out")
    assert report.status == "COMPLETED", report.error
    assert report.output["label"] == "dark"
    assert report.key == key  # no new image: the input is the current object
    result = stack.take_image(key)
    assert same_pixels(result, dark)


def test_a_failing_task_reports_its_own_traceback(stack: Stack, worker: WorkerProcess) -> None:
    """The report says where the task's code raised, from the task's function on (not the
    worker's frames); a failure of the input, not of task code, carries none."""
    key = stack.put(worker, picture(8, 8))
    failed = stack.run(
        worker, task="tests.orchestrator.flaky_tasks:fail_first_attempt", key=key, attempt=1
    )
    assert failed.status == "FAILED"
    lines = failed.traceback.splitlines()
    assert lines[0] == "Traceback (most recent call last):", failed.traceback
    assert "flaky_tasks.py" in lines[1] and "in fail_first_attempt" in lines[1], lines
    assert lines[-1] == "RuntimeError: a transient failure on the first attempt"
    assert "run_task_with_inputs" not in failed.traceback
    stack.take(key)
    missing = stack.run(worker, task="deblur", key=f"obj-{uuid.uuid4().hex}")
    assert missing.status == "FAILED" and missing.traceback == "", missing


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
    img = picture(8, 8)
    key = stack.put(worker, img)
    report = stack.run(worker, task="no-such-task", key=key, output_key=f"{key}-out")
    assert (report.status, report.retryable) == ("FAILED", False)
    assert "no-such-task" in report.error
    assert same_pixels(stack.take_image(key), img)


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
    img = picture(8, 8)
    key = stack.put(worker, img)
    report = stack.run(worker, task=task, key=key, output_key=f"{key}-out")
    assert (report.status, report.retryable) == ("FAILED", False), report.error
    assert says in report.error and task in report.error
    assert same_pixels(stack.take_image(key), img)
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
    key = stack.put(worker, picture(8, 8))
    assert stack.run(worker, task="noop", key=key).status == "COMPLETED"
    stack.take(key)
    assert stack.redis.llen(keys.worker_inflight_key(worker.worker_id)) == 0


def test_a_report_redis_refuses_is_dropped_and_acknowledged(
    stack: Stack, worker: WorkerProcess
) -> None:
    """A report list that is not a list (WRONGTYPE): nothing to retry, nothing left in flight."""
    key = stack.put(worker, picture(8, 8))
    reply_to = f"test-string:{uuid.uuid4().hex}"
    stack.redis.set(reply_to, "not a list")
    stack.send(worker, task="noop", key=key, reply_to=reply_to)
    inflight = keys.worker_inflight_key(worker.worker_id)
    poll(lambda: stack.owner(key) == SCHEDULER, "the object's return")
    poll(lambda: stack.redis.llen(inflight) == 0, "the acknowledgement")
    assert stack.redis.get(reply_to) == b"not a list"
    assert "refused the report" in worker.log()
    stack.take(key)
    # The loop still runs.
    again = stack.put(worker, picture(8, 8))
    assert stack.run(worker, task="noop", key=again).status == "COMPLETED"
    stack.take(again)


def test_heartbeat_has_every_field(stack: Stack, worker: WorkerProcess) -> None:
    key = keys.worker_key(worker.worker_id)
    beat = {as_text(k): as_text(v) for k, v in stack.redis.hgetall(key).items()}
    assert set(beat) == set(keys.WORKER_FIELDS) and beat["slots"] == "1"
    assert 0 <= float(beat["cpu"]) <= 100 and 0 < float(beat["mem"]) <= 100
    assert int(beat["queue_depth"]) >= 0 and int(beat["running"]) >= 0 and beat["host"]
    assert float(beat["started_at"]) <= float(beat["last_heartbeat"])
    assert int(beat["held_images"]) >= 0 and int(beat["held_bytes"]) >= 0
    assert stack.redis.sismember(keys.WORKERS, worker.worker_id)
    assert 0 < stack.redis.ttl(key) <= 10 * keys.HEARTBEAT_INTERVAL_S
    # It is refreshed.
    first = float(beat["last_heartbeat"])
    poll(lambda: float(stack.redis.hget(key, "last_heartbeat") or 0) > first, "a new heartbeat")
