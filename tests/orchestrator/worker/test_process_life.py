"""The worker process's life: timeouts (a task that stops when asked, and one that does not),
SIGKILL and SIGTERM mid-task, concurrency, a missing minion, dropped Redis connections, an
instruction sent twice."""

from __future__ import annotations

import signal
import subprocess
import sys
import uuid

import msgspec

from cdi import ObjectKey
from orchestrator.contract import keys
from orchestrator.contract.messages import Instruction, Stop
from orchestrator.contract.vocabulary import TaskRunStatus
from tests.orchestrator.worker.support import (
    DEADLINE_S,
    ROOT,
    Stack,
    WorkerProcess,
    picture,
    poll,
    same_pixels,
)


def _started_at(stack: Stack, worker: WorkerProcess) -> bytes | str | None:
    """The ``started_at`` of the worker's heartbeat: a new one means a new process."""
    return stack.redis.hget(keys.worker_key(worker.worker_id), "started_at")


def test_a_task_past_its_timeout_that_stops_when_asked_leaves_the_worker_as_it_was(
    stack: Stack, worker: WorkerProcess
) -> None:
    """The bundled sleep waits on ``ctx.cancelled``: stopped at its timeout it ends at once,
    is reported TIMED_OUT (retryable), and the same process runs the next task."""
    before = _started_at(stack, worker)
    img = picture(8, 8)
    key = stack.put(worker, img)
    report = stack.run(worker, task="sleep", params={"ms": 20_000}, timeout_s=0.2, key=key,
                       keep=True)  # fmt: skip
    assert (report.status, report.retryable, report.restarting) == ("TIMED_OUT", True, False)
    assert report.finished_at - report.started_at < 20, report  # it did not sleep on
    assert (report.key, report.kept) == (key, False)  # a task that did not complete: back
    assert same_pixels(stack.take_image(key), img)
    key = stack.put(worker, img)
    assert stack.run(worker, task="noop", key=key).status == "COMPLETED"
    stack.take(key)
    assert _started_at(stack, worker) == before  # one process all along


def test_a_task_that_will_not_stop_costs_its_process_and_a_fresh_one_goes_on(
    stack: Stack,
) -> None:
    """A task in ``time.sleep`` past its timeout cannot be stopped in its thread: the report
    says where it was and that the worker starts afresh; the process ends, the object comes
    back, and the keeper's fresh process (same worker, same PID seen from outside) runs the
    next task."""
    worker = stack.start_worker()
    before = _started_at(stack, worker)
    img = picture(8, 8)
    key = stack.put(worker, img)
    report = stack.run(worker, task="tests.orchestrator.flaky_tasks:stubborn_sleep",
                       params={"ms": 60_000}, timeout_s=0.5, key=key, keep=True)  # fmt: skip
    assert (report.status, report.retryable, report.restarting) == ("TIMED_OUT", True, True)
    assert "in stubborn_sleep" in report.traceback and "time.sleep(" in report.traceback
    assert (report.key, report.kept) == (key, False)
    assert same_pixels(stack.take_image(key), img)
    poll(lambda: _started_at(stack, worker) not in (None, before), "a fresh process's beat")
    key = stack.put(worker, img)
    assert stack.run(worker, task="noop", key=key).status == "COMPLETED"
    stack.take(key)
    assert worker.proc.poll() is None, worker.log()  # the keeper never ended
    assert "starting a fresh one" in worker.log()


def _stop(stack: Stack, worker: WorkerProcess, ins: Instruction, reason: str) -> None:
    """What the scheduler sends when the run of ``ins`` is cancelled."""
    stop = Stop(ins.task_run_id, ins.workflow_id, TaskRunStatus.CANCELLED, reason)
    stack.redis.lpush(keys.worker_control_key(worker.worker_id), stop.dumps())


def test_a_stop_ends_the_running_task_after_its_cleanup_and_one_sent_early_prevents_it(
    stack: Stack, worker: WorkerProcess
) -> None:
    """A stop on the control list reaches the task while it runs: its ``on_cancel`` callback
    runs, it ends, and the report says CANCELLED with the stop's reason; the object comes
    back. A stop for a task run not started yet stops it before its task begins."""
    before = _started_at(stack, worker)
    img = picture(8, 8)
    key = stack.put(worker, img)
    marker = stack.tmp / f"cancelled-{uuid.uuid4().hex}"
    ins, _ = stack.send(worker, task="tests.orchestrator.flaky_tasks:wait_for_cancel",
                        params={"ms": 60_000, "marker": str(marker)}, key=key)  # fmt: skip
    beat = keys.worker_key(worker.worker_id)
    poll(lambda: stack.redis.hget(beat, "running") == b"1", "the task to be running")
    _stop(stack, worker, ins, "stopped: the run was cancelled")
    report = stack.report(ins, worker)
    assert (report.status, report.error) == ("CANCELLED", "stopped: the run was cancelled")
    assert (report.retryable, report.restarting) == (False, False)
    assert marker.read_text() == "cancelled"  # its cleanup ran
    assert (report.key, report.kept) == (key, False)
    assert same_pixels(stack.take_image(key), img)

    key = stack.put(worker, img)
    early = msgspec.structs.replace(
        ins, task_run_id=ins.task_run_id + 1, key=ObjectKey(key), params={"ms": 60_000}
    )
    _stop(stack, worker, early, "stopped: the run was cancelled")
    # Sent early: the worker has taken the stop before the instruction comes (else it is a
    # stop of a running task, as above).
    control = keys.worker_control_key(worker.worker_id)
    poll(lambda: stack.redis.llen(control) == 0, "the worker to take the stop")
    stack.redis.lpush(keys.worker_queue_key(worker.worker_id), early.dumps())
    report = stack.report(early, worker)
    assert (report.status, report.cpu_ms) == ("CANCELLED", None)  # its task never ran
    assert same_pixels(stack.take_image(key), img)
    assert _started_at(stack, worker) == before


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
    assert stack.redis.lrange(keys.worker_inflight_key(worker.worker_id), 0, -1) == [raw]
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
    # A second, not the 30 s a worker restarted with its minion waits for it.
    env = stack.env | {"CDI_URL": f"unix://{missing}", "CDIFLOW_WORKER_CONNECT_WAIT_S": "1"}
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
