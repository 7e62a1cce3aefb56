"""The worker's main loop: a reliable pop from its own queue, run, report, acknowledge.

Each slot (``concurrency`` of them) takes an instruction moved from ``keys.worker_queue_key``
into ``keys.worker_inflight_key`` (``intake``: up to the free slots' worth in one call), runs it
on its data plane, and in one Redis script LPUSHes the ``Report`` onto ``reply_to`` (ringing its
bell, ``keys.report_bell_key``) and LREMs the instruction from the in-flight list (``replies``:
reports that end together go in one call). What waits only for S3 (a last task's store,
``Execution.later``) is finished and reported by a thread of its own, while the slot goes on to
its next instruction. A worker killed mid-task therefore leaves the instruction in flight for
the scheduler to requeue. An instruction sent again (``repeats``) is never run twice: a repeat
of one that finished gets its report again, a repeat of one that runs now is dropped. One that
is not an instruction is dropped, unless it names a task run and where to report it: that task
run then fails for good (a retry would send the same).

A task run is stopped with a ``Stop`` on the worker's control list, which a thread of its own
pops (the slots may all be busy): ``stopping`` says how.

Nothing an instruction does can end the loop, except what Python cannot recover from inside
the process. A task that would not stop (asked to, or past its timeout): the worker reports
it, then ends the process at once (``EXIT_TASK_STUCK``); its keeper starts a fresh one
(``keeper``). A lost CDI minion: it reports, stops like on SIGTERM and exits non-zero to be
restarted.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from typing import Final, NoReturn

import msgspec
import redis

from cdi import ObjectKey
from orchestrator.contract import keys
from orchestrator.contract.messages import Instruction, Report, Stop
from orchestrator.contract.vocabulary import DataPlane, TaskRunStatus
from orchestrator.errors import InvalidInstruction
from orchestrator.logs import log_context
from orchestrator.worker.execution import EXIT_TASK_STUCK, Execution, TaskCall
from orchestrator.worker.heartbeat import Heartbeat
from orchestrator.worker.input_cache_host import CacheFigures
from orchestrator.worker.intake import POP_TIMEOUT_S, Intake
from orchestrator.worker.metrics import WorkerMetrics
from orchestrator.worker.planes import Plane
from orchestrator.worker.repeats import RUNNING, Repeats
from orchestrator.worker.replies import Replies
from orchestrator.worker.stopping import StopRequest, StopRequests
from orchestrator.worker.streams import StreamHub
from workflows.loader import TaskCatalog
from workflows.sources import BUNDLED, TaskSources

__all__ = ["POP_TIMEOUT_S", "Worker", "parse_instruction"]

log = logging.getLogger(__name__)

# Stores a slot may leave to finish before it waits for one: they go on side by side, and
# each holds its image and object until done, so a slow S3 must not let them pile up.
FINISH_AHEAD: Final = 2
_REDIS_DOWN_RETRY_S: Final = 1.0


def parse_instruction(raw: bytes) -> Instruction:
    """``Instruction.loads`` plus what a report needs; ``InvalidInstruction`` otherwise."""
    try:
        ins = Instruction.loads(raw)
    except (ValueError, TypeError) as exc:  # bad JSON, not an object, missing/unknown fields
        raise InvalidInstruction(f"not an instruction: {exc}") from exc
    if not ins.reply_to:
        raise InvalidInstruction("the instruction names no reply_to list")
    return ins


class _Addressed(msgspec.Struct):
    """What a report needs of a message that is not an instruction."""

    task_run_id: int
    workflow_id: str
    reply_to: str
    key: str = ""


_ADDRESSED: Final = msgspec.json.Decoder(_Addressed)


class Worker:
    """One worker process's slots, heartbeat and data planes (``planes``: what runs each
    instruction, by its ``data_plane``). ``host``: its CDI host, for the heartbeat;
    ``held``: the images it holds between tasks now, and their bytes; ``input_cache``: the
    host's input cache as it sees it, when the cache is on."""

    def __init__(
        self,
        worker_id: str,
        *,
        redis_client: redis.Redis,
        planes: Mapping[DataPlane, Plane],
        host: str | None = None,
        held: Callable[[], tuple[int, int]] = lambda: (0, 0),
        input_cache: Callable[[], CacheFigures] | None = None,
        concurrency: int = 1,
        heartbeat_interval_s: float = keys.HEARTBEAT_INTERVAL_S,
        sources: TaskSources = BUNDLED,
        tasks: TaskCatalog | None = None,
        streams: StreamHub | None = None,
    ) -> None:
        self.worker_id = worker_id
        self.sources = sources  # where tasks may be loaded from
        self.metrics: WorkerMetrics | None = None  # set to count task runs for Prometheus
        self.redis = redis_client  # bytes replies: LREM must match the raw instruction exactly
        self._thread_local = threading.local()
        self._thread_clients: list[redis.Redis] = []
        self._planes = planes  # what runs each instruction, by its ``data_plane``
        self.streams = streams  # streaming steps' channels (None: this worker runs none)
        self.concurrency = concurrency
        self.queue_key = keys.worker_queue_key(worker_id)
        self.inflight_key = keys.worker_inflight_key(worker_id)
        self.control_key = keys.worker_control_key(worker_id)
        self.stops = StopRequests()  # what the control list asked to stop
        self.exit_code = 0
        self._stop = threading.Event()
        self.intake = Intake(
            redis_client, self.queue_key, self.inflight_key, concurrency, self._own_client,
            self._stop,
        )  # fmt: skip
        self.replies = Replies(redis_client, self.inflight_key, self._own_client, self._stop.is_set)
        self._lock = threading.Lock()
        self._running = 0
        self._repeats = Repeats()
        # Finishes instructions whose rest waits for S3 (``Execution.later``).
        self._finisher = ThreadPoolExecutor(concurrency * FINISH_AHEAD, thread_name_prefix="finish")
        self._finishing = threading.BoundedSemaphore(concurrency * FINISH_AHEAD)
        self.heartbeat = Heartbeat(
            redis_client,
            worker_id,
            running=self.running,
            held=held,
            input_cache=input_cache,
            slots=concurrency,
            interval_s=heartbeat_interval_s,
            host=host,
            tasks=tasks,
        )

    # ------------------------------------------------------------------ lifecycle
    def running(self) -> int:
        """Instructions being run right now."""
        with self._lock:
            return self._running

    def request_stop(self, exit_code: int = 0) -> None:
        """Stop popping; slots finish what they run. Safe from a signal handler."""
        if exit_code and not self.exit_code:
            self.exit_code = exit_code
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def run(self) -> int:
        """Beat, run the slots until ``request_stop``, clean up; return the exit code."""
        self._note_stale_inflight()
        self.intake.load()
        self.replies.load()
        self.heartbeat.start()
        slots = [
            threading.Thread(target=self._slot, name=f"slot-{n}") for n in range(self.concurrency)
        ]
        slots.append(threading.Thread(target=self._listen_for_stops, name="stops"))
        for slot in slots:
            slot.start()
        log.info(
            "worker %s ready: popping %s with %d slot(s)",
            self.worker_id,
            self.queue_key,
            self.concurrency,
        )
        try:
            while not self._stop.wait(1.0):  # a timed wait lets the main thread take signals
                pass
        finally:
            self._stop.set()
            for slot in slots:
                slot.join()
            self._finisher.shutdown(wait=True)  # what the slots left to finish is reported
            self.heartbeat.stop(remove=True)
            for client in self._thread_clients:
                client.close()
        log.info("worker %s stopped (exit code %d)", self.worker_id, self.exit_code)
        return self.exit_code

    def _note_stale_inflight(self) -> None:
        stale = self.redis.llen(self.inflight_key)
        if stale:
            log.warning(
                "%d instruction(s) in %s were left by a previous run of %s; not running them "
                "again (their objects went back to the scheduler): the scheduler requeues them",
                stale,
                self.inflight_key,
                self.worker_id,
            )

    def _own_client(self) -> redis.Redis:
        """This thread's client, on a connection of its own from the shared pool. *Why:*
        redis-py takes a connection from the pool and returns it around every command, a
        sizeable share of a command's client CPU (redis-py 8.1); slots and finishers each send two
        commands a task."""
        client: redis.Redis | None = getattr(self._thread_local, "client", None)
        if client is None:
            client = redis.Redis(
                connection_pool=self.redis.connection_pool, single_connection_client=True
            )
            self._thread_local.client = client
            with self._lock:
                self._thread_clients.append(client)
        return client

    # ------------------------------------------------------------------ the loop
    def _slot(self) -> None:
        try:
            raw = self.intake.next()
            while raw is not None:
                self._handle(raw)
                raw = self.intake.next(done=True)
        except BaseException:
            log.critical("a worker slot crashed; stopping the worker", exc_info=True)
            self.request_stop(1)
            raise

    def _listen_for_stops(self) -> None:
        """Pop the control list: each ``Stop`` goes to the task run it names (``stops``)."""
        try:
            while not self._stop.is_set():
                try:
                    popped = self._own_client().blpop([self.control_key], POP_TIMEOUT_S)
                except redis.RedisError as exc:
                    log.warning("cannot pop %s: %s; retrying", self.control_key, exc)
                    self._stop.wait(_REDIS_DOWN_RETRY_S)
                    continue
                if popped is not None:
                    self._on_stop(popped[1])
        except BaseException:
            log.critical("the stop listener crashed; stopping the worker", exc_info=True)
            self.request_stop(1)
            raise

    def _on_stop(self, raw: bytes | str) -> None:
        try:
            stop = Stop.loads(raw)
            request = StopRequest(TaskRunStatus(stop.status), str(stop.reason))
        except (ValueError, TypeError) as exc:
            log.error("dropping an unusable stop %.300r: %s", raw, exc)
            return
        running = self.stops.ask(stop.task_run_id, request)
        now = "running" if running else "not running now"
        log.info("asked to stop task run %s (workflow %s, %s): %s",
                 stop.task_run_id, stop.workflow_id, now, stop.reason)  # fmt: skip

    def _handle(self, raw: bytes) -> None:
        try:
            ins = parse_instruction(raw)
        except InvalidInstruction as exc:
            self._refuse(raw, exc)
            return
        earlier = self._repeats.begin(ins)
        if earlier == RUNNING:
            log.warning("task run %s was sent again while it runs; dropped", ins.task_run_id)
            self._deliver(raw, None, None)
            return
        if isinstance(earlier, Report):
            log.warning("task run %s was sent again; sending its report again", ins.task_run_id)
            self._deliver(raw, ins.reply_to, earlier)
            return
        started_at = time.time()
        with _about(ins):
            try:
                exe = self._execute(ins)
            except Exception as exc:  # a bug of ours: still answer, so the run is not lost
                log.exception("instruction %s crashed the worker's runner", ins.task_run_id)
                exe = Execution(key=ins.key)
                exe.fail(exc)
            if exe.later is not None:
                # The rest (a last task's store) waits for S3: the slot pops its next task
                # meanwhile.
                self._finishing.acquire()
                self._finisher.submit(self._finish_later, raw, ins, exe, started_at)
            else:
                self._finish(raw, ins, exe, started_at)

    def _refuse(self, raw: bytes, exc: InvalidInstruction) -> None:
        """Fail, for good, the task run a message that is not an instruction names; with no
        task run or reply_to to name there is nobody to tell, and keeping it in flight helps
        no one."""
        try:
            to: _Addressed | None = _ADDRESSED.decode(raw)
        except msgspec.DecodeError:
            to = None
        if to is None or not to.reply_to:
            log.error("dropping an unusable instruction %.300r: %s", raw, exc)
            self._deliver(raw, None, None)
            return
        log.error("task run %s: %s", to.task_run_id, exc)
        exe = Execution(key=ObjectKey(to.key))
        exe.fail(exc)
        now = time.time()
        report = Report(
            task_run_id=to.task_run_id, workflow_id=to.workflow_id, worker_id=self.worker_id,
            status=exe.status, started_at=now, finished_at=now, error=exe.error,
            retryable=exe.retryable, key=exe.key,
        )  # fmt: skip
        self._deliver(raw, to.reply_to, report)

    def _finish_later(
        self, raw: bytes, ins: Instruction, exe: Execution, started_at: float
    ) -> None:
        """A finisher thread's job: like a slot, a crash here stops the worker."""
        try:
            with _about(ins):
                self._finish(raw, ins, exe, started_at)
        except BaseException:
            log.critical("finishing an instruction crashed; stopping the worker", exc_info=True)
            self.request_stop(1)
            raise
        finally:
            self._finishing.release()

    def _finish(self, raw: bytes, ins: Instruction, exe: Execution, started_at: float) -> None:
        """Run what the instruction left for later, then report and acknowledge it."""
        if exe.later is not None:
            later, exe.later = exe.later, None
            try:
                later()
            except Exception as exc:  # a bug of ours: still answer, so the run is not lost
                log.exception("instruction %s crashed while finishing", ins.task_run_id)
                exe.fail(exc)
        report = exe.report(ins, self.worker_id, started_at, time.time())
        self._repeats.finish(ins, report)
        self._deliver(raw, ins.reply_to, report)
        if self.metrics is not None:
            self.metrics.observe(ins, report)
        _log_outcome(ins, report)  # after the delivery: the scheduler need not wait for a log line
        exit_code = exe.exit_code
        if exit_code == EXIT_TASK_STUCK:
            log.critical(
                "task %r of task run %s did not stop when asked (%s) and its thread cannot be "
                "killed: this process ends now (code %d), and its keeper starts a fresh one",
                ins.task,
                ins.task_run_id,
                report.error,
                exit_code,
            )
            _end_process(exit_code)
        if exit_code:
            log.critical("%s; exiting with code %d to be restarted", report.error, exit_code)
            self.request_stop(exit_code)

    def _execute(self, ins: Instruction) -> Execution:
        exe = Execution(key=ins.key)
        with self._counted():
            plane = self._planes.get(ins.data_plane)
            if plane is None:
                known = ", ".join(repr(str(p)) for p in self._planes)
                exe.fail(
                    InvalidInstruction(
                        f"instruction {ins.task_run_id}: unknown data_plane "
                        f"{ins.data_plane!r}; expected one of {known}"
                    )
                )
            else:
                plane.run(ins, TaskCall(ins, self.sources, self.stops, self.streams), exe)
                if ins.channels:
                    # Its peers ran with it: a retry alone would find its channels gone.
                    exe.retryable = False
        return exe

    @contextmanager
    def _counted(self) -> Iterator[None]:
        with self._lock:
            self._running += 1
        try:
            yield
        finally:
            with self._lock:
                self._running -= 1

    def _deliver(self, raw: bytes, reply_to: str | None, report: Report | None) -> None:
        """Send ``report`` on ``reply_to`` and acknowledge ``raw`` (``Replies``); with no report,
        acknowledge ``raw`` alone."""
        if reply_to is not None and report is not None:
            self.replies.deliver(raw, reply_to, report.dumps())
            return
        try:
            self._own_client().lrem(self.inflight_key, 1, raw)  # type: ignore[arg-type]
        except redis.RedisError as exc:
            log.error("cannot remove an instruction from %s: %s", self.inflight_key, exc)


def _end_process(code: int) -> NoReturn:
    """End this process now, whatever its other threads do: the stuck task's thread with it.
    What it held goes back by the minion's recovery rule; the scheduler retries the other
    instructions it had popped (they stay in flight) without spending their retries."""
    for handler in logging.getLogger().handlers:
        handler.flush()
    os._exit(code)


def _about(ins: Instruction) -> AbstractContextManager[None]:
    """Every line logged while ``ins`` is handled names its workflow and task run."""
    return log_context(
        workflow_id=ins.workflow_id, task_run_id=ins.task_run_id, step=ins.ref,
        attempt=ins.attempt,
    )  # fmt: skip


def _log_outcome(ins: Instruction, report: Report) -> None:
    log.log(
        logging.INFO if report.status == TaskRunStatus.COMPLETED else logging.WARNING,
        "task run %s %s (workflow %s, attempt %s): %s in %.1f ms%s",
        ins.task_run_id,
        ins.task,
        ins.workflow_id,
        ins.attempt,
        report.status,
        (report.finished_at - report.started_at) * 1000,
        f": {report.error}" if report.error else "",
    )
