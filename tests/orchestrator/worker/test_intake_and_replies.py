"""How a worker talks to Redis in bulk: it pops up to its free slots' worth of instructions in
one call (``intake``), and sends the reports that end together in one call (``replies``). The
Redis commands are counted with MONITOR, on the keys of the test's own."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import redis

from orchestrator.contract import keys
from orchestrator.contract.messages import Report, Stop
from orchestrator.contract.vocabulary import TaskRunStatus
from orchestrator.worker.replies import Replies
from tests.orchestrator.worker.support import Stack, poll


@contextmanager
def _commands(r: redis.Redis, naming: str) -> Iterator[list[str]]:
    """The commands clients (not scripts) send while the block runs that name ``naming``:
    each its name and arguments, as MONITOR shows them."""
    seen: list[str] = []
    end = f"monitor-end:{uuid.uuid4().hex}"
    monitor = r.monitor()
    monitor.__enter__()

    def watch() -> None:
        while True:
            line = monitor.next_command()
            command = str(line["command"])
            if end in command:
                return
            if naming in command and line.get("client_type") != "lua":
                seen.append(command)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        yield seen
    finally:
        r.get(end)
        watcher.join()
        monitor.__exit__(None, None, None)


def test_a_worker_pops_its_free_slots_worth_in_one_call(stack: Stack) -> None:
    """Three instructions waiting for a worker of three slots: one call moves all three into
    its in-flight list (none is popped by a call of its own)."""
    worker_id = f"wt-{uuid.uuid4().hex[:10]}"
    queue, inflight = keys.worker_queue_key(worker_id), keys.worker_inflight_key(worker_id)
    reply_to = f"test-replies:{uuid.uuid4().hex}"
    sent = [
        stack.instruction(
            task="sleep", data_plane="none", params={"ms": 600_000}, reply_to=reply_to
        )
        for _ in range(3)
    ]
    stack.redis.lpush(queue, *(ins.dumps() for ins in sent))
    with _commands(stack.redis, queue) as commands:
        worker = stack.start_worker("--concurrency", "3", worker_id=worker_id)
        poll(lambda: stack.redis.llen(inflight) == 3, "three instructions in flight")
    pops = [c for c in commands if c.split()[0].upper() in ("BLMOVE", "LMOVE", "EVALSHA")]
    assert [p.split()[0].upper() for p in pops] == ["EVALSHA"], pops
    # Each slot runs one: stopped, each reports.
    control = keys.worker_control_key(worker_id)
    for ins in sent:
        stack.redis.lpush(
            control,
            Stop(ins.task_run_id, ins.workflow_id, TaskRunStatus.CANCELLED, "test").dumps(),
        )
    got = {r.task_run_id: r.status for r in stack.reports(reply_to, 3, worker)}
    assert got == dict.fromkeys((i.task_run_id for i in sent), "CANCELLED")
    poll(lambda: stack.redis.llen(inflight) == 0, "every instruction acknowledged")


def _report(n: int) -> bytes:
    return Report(n, str(uuid.uuid4()), "wt", TaskRunStatus.COMPLETED, 1.0, 2.0).dumps()


def test_reports_that_end_while_one_is_sent_go_together_in_the_next_call(stack: Stack) -> None:
    """While one delivery is out (Redis paused), three more come: they go in one call, after
    it; each report reaches its list in order, rings its bell and acknowledges its
    instruction, and a list Redis refuses costs only its own report."""
    r = stack.redis
    inflight = f"test-inflight:{uuid.uuid4().hex}"
    good, bad = f"test-replies:{uuid.uuid4().hex}", f"test-string:{uuid.uuid4().hex}"
    r.set(bad, "not a list")
    raws = [f"instruction {n}".encode() for n in range(4)]
    r.lpush(inflight, *raws)
    replies = Replies(r, inflight, lambda: r, lambda: False)
    replies.load()
    to = [good, good, bad, good]

    def deliver(n: int) -> Callable[[], None]:
        return lambda: replies.deliver(raws[n], to[n], _report(n))

    threads = [threading.Thread(target=deliver(n)) for n in range(4)]
    with _commands(r, inflight) as calls:
        r.execute_command("CLIENT", "PAUSE", 60_000, "WRITE")
        try:
            threads[0].start()
            poll(lambda: replies.sending, "the first delivery out")
            for thread in threads[1:]:
                thread.start()
            poll(lambda: replies.waiting() == 3, "three deliveries waiting")
        finally:
            r.execute_command("CLIENT", "UNPAUSE")
        for thread in threads:
            thread.join()
    assert [c.split()[0].upper() for c in calls] == ["EVALSHA", "EVALSHA"], calls
    assert [Report.loads(t).task_run_id for t in reversed(r.lrange(good, 0, -1))] == [0, 1, 3]
    assert r.llen(keys.report_bell_key(good)) == 3 and not r.exists(keys.report_bell_key(bad))
    assert r.get(bad) == b"not a list" and r.llen(inflight) == 0
    r.delete(good, bad, keys.report_bell_key(good))
