"""What both data planes share: the running record of one instruction, and the task call.

A data plane fills an ``Execution`` as it goes and turns any exception into a failure with
``fail``; the worker then makes the ``Report`` from it. Nothing here touches Redis or CDI.
"""

from __future__ import annotations

import logging
import math
import queue
import sys
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Final, NoReturn

import cdi
from cdi import ObjectKey
from orchestrator.contract.messages import MAX_TRACEBACK, Instruction, Report
from orchestrator.contract.vocabulary import TaskRunStatus
from orchestrator.errors import (
    InputMissing,
    InputTooLarge,
    InvalidInstruction,
    InvalidRequest,
    ObjectGone,
    OrchestratorError,
    StorageUnavailable,
    TaskStopped,
    TaskTimedOut,
    WorkerError,
)
from orchestrator.objectstore import ObjectStore
from orchestrator.worker.stopping import StopRequest, StopRequests, ask_to_stop
from orchestrator.worker.streams import StreamHub
from workflows.api import Produced, TaskContext, TaskSpec, load_task, run_task_with_inputs
from workflows.errors import (
    InputsMismatch,
    InvalidData,
    InvalidImage,
    NeedsImage,
    TaskNotAllowed,
    TaskNotFound,
    WorkflowsError,
)
from workflows.sources import BUNDLED, TaskSources
from workflows.streaming import StreamBroken
from workflows.tracebacks import clear_frames, stack_of, task_traceback

__all__ = [
    "EXIT_MINION_LOST",
    "EXIT_TASK_STUCK",
    "Execution",
    "TaskCall",
    "check_common",
    "elapsed_ms",
    "read_input_file",
]

log = logging.getLogger(__name__)

# Exit codes of a worker process that must be started afresh: its keeper does so at once for a
# stuck task (``keeper``), the stack supervisor for the rest.
EXIT_TASK_STUCK: Final = 3  # a stopped task's thread still runs, and Python cannot kill it
EXIT_MINION_LOST: Final = 4  # the CDI minion went away: every object of ours went with it

# A retry cannot fix these: the same input or instruction fails the same way.
_PERMANENT: Final = (
    InvalidImage,
    InvalidData,
    InputsMismatch,
    NeedsImage,
    TaskNotFound,
    TaskNotAllowed,
    InputMissing,
    InputTooLarge,
    InvalidRequest,  # e.g. an S3 URI outside the policy, or a key no store can hold
)


def elapsed_ms(since: float) -> float:
    """Milliseconds since ``since`` (a ``time.perf_counter()`` reading)."""
    return (time.perf_counter() - since) * 1000.0


@dataclass
class Execution:
    """The outcome of one instruction, filled in by a data plane."""

    status: TaskRunStatus = TaskRunStatus.COMPLETED
    output: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    traceback: str = ""  # where the task's code failed (``workflows.tracebacks``)
    retryable: bool = True
    key: ObjectKey = ObjectKey("")
    kept: bool = False
    handed_to: str = ""  # where ``key`` and the outputs went (``Instruction.hand_to``)
    held: bool = False
    held_lost: bool = False
    objects_gone: bool = False
    outage: bool = False  # S3 did not answer: the scheduler tries again while that lasts
    stored: bool = False
    bytes_in: int = 0
    bytes_out: int = 0
    read_ms: float = 0.0
    compute_ms: float = 0.0
    cpu_ms: float | None = None  # set once the task function has run
    write_ms: float = 0.0
    return_us: float = 0.0
    objects: dict[str, Any] = field(default_factory=dict)  # named outputs written
    results: dict[str, Any] = field(default_factory=dict)  # named outputs stored in S3
    released: list[ObjectKey] = field(default_factory=list)  # shares given up
    # owned inputs handed back, and what it made that did not go on to ``handed_to``
    returned: list[ObjectKey] = field(default_factory=list)
    exit_code: int = 0  # non-zero: the worker must exit after reporting
    # The rest of the instruction, for the worker to run once the slot has moved on; it
    # completes this record before the report is made.
    later: Callable[[], None] | None = None

    def fail(self, exc: BaseException) -> None:
        """Record ``exc`` as this instruction's failure (the first failure wins)."""
        if self.status != TaskRunStatus.COMPLETED:
            log.warning("a second failure after %r: %s", self.error, exc)
            return
        stopped = exc if isinstance(exc, TaskStopped) else None
        self.status = stopped.status if stopped is not None else TaskRunStatus.FAILED
        self.output = {}
        self.objects = {}
        self.results = {}
        self.error = _describe(exc)
        self.traceback = bounded_traceback(stopped.where) if stopped else _traceback(exc)
        self.objects_gone = isinstance(exc, ObjectGone)
        self.outage = isinstance(exc, StorageUnavailable)
        if isinstance(exc, WorkerError):
            self.retryable = exc.retryable
        else:
            self.retryable = not isinstance(exc, _PERMANENT)
        if stopped is not None and stopped.stuck:
            self.exit_code = EXIT_TASK_STUCK
        elif isinstance(exc, cdi.MinionUnavailable):
            self.exit_code = EXIT_MINION_LOST
        if not isinstance(exc, OrchestratorError | WorkflowsError | cdi.CDIError):
            log.error("unexpected error: %s", self.error, exc_info=exc)

    def note(self, problem: str) -> None:
        """Add a problem that does not change the status (e.g. a hand-back that failed)."""
        self.error = f"{self.error}; {problem}" if self.error else problem

    def report(
        self, ins: Instruction, worker_id: str, started_at: float, finished_at: float
    ) -> Report:
        return Report(
            task_run_id=ins.task_run_id,
            workflow_id=ins.workflow_id,
            worker_id=worker_id,
            status=self.status,
            started_at=started_at,
            finished_at=finished_at,
            output=self.output,
            error=self.error,
            traceback=self.traceback,
            retryable=self.retryable,
            key=self.key,
            kept=self.kept,
            handed_to=self.handed_to,
            held=self.held,
            held_lost=self.held_lost,
            objects_gone=self.objects_gone,
            outage=self.outage,
            stored=self.stored,
            bytes_in=self.bytes_in,
            bytes_out=self.bytes_out,
            read_ms=round(self.read_ms, 3),
            compute_ms=round(self.compute_ms, 3),
            cpu_ms=None if self.cpu_ms is None else round(self.cpu_ms, 3),
            write_ms=round(self.write_ms, 3),
            return_us=round(self.return_us, 1),
            objects=self.objects,
            results=self.results,
            released=self.released,
            returned=self.returned,
            restarting=bool(self.exit_code),
        )


def _describe(exc: BaseException) -> str:
    # Our own error trees already say what failed and what to do; others need their type.
    if isinstance(exc, OrchestratorError | WorkflowsError | cdi.CDIError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def _traceback(exc: BaseException) -> str:
    """What a report says of where ``exc`` came from: the task code's traceback, or ours for
    an error of no documented tree (a bug), cut to its last ``MAX_TRACEBACK`` characters."""
    text = task_traceback(exc)
    if not text and not isinstance(exc, OrchestratorError | WorkflowsError | cdi.CDIError):
        text = "".join(traceback.format_exception(exc))
    return bounded_traceback(text)


def bounded_traceback(text: str) -> str:
    """``text`` cut to its last ``MAX_TRACEBACK`` characters (the end says what was raised
    where), with a first line that says so."""
    if len(text) <= MAX_TRACEBACK:
        return text
    cut = len(text) - MAX_TRACEBACK
    return f"[the first {cut} characters of this traceback are left out]\n{text[cut:]}"


def check_common(ins: Instruction) -> None:
    """Raise ``InvalidInstruction`` if a field every plane needs has the wrong type."""
    problems = []
    if not isinstance(ins.task, str) or not ins.task:
        problems.append("task must be a non-empty string")
    if isinstance(ins.attempt, bool) or not isinstance(ins.attempt, int):
        problems.append("attempt must be an integer")
    if (
        isinstance(ins.timeout_s, bool)
        or not isinstance(ins.timeout_s, int | float)
        or math.isnan(ins.timeout_s)
    ):
        problems.append("timeout_s must be a number of seconds")
    if not isinstance(ins.params, dict):
        problems.append("params must be a JSON object")
    if not isinstance(ins.workflow_id, str):
        problems.append("workflow_id must be a string")
    if problems:
        raise InvalidInstruction(f"instruction {ins.task_run_id}: {'; '.join(problems)}")


def read_input_file(store: ObjectStore, uri: str, limit: int) -> bytes:
    """A file a task names (``TaskContext.read_file``), held to what the API holds an input
    image to: within the locations cdiflow reads inputs from, at most ``limit`` bytes."""
    store.policy.check_input(uri)
    return store.get(uri, limit)


@dataclass(frozen=True)
class TaskCall:
    """Loads the instruction's task (only from ``sources``, whatever the instruction says)
    and runs it in a thread of its own, under its timeout and until it is asked to stop
    (``stops``, ``orchestrator.worker.stopping``)."""

    ins: Instruction
    sources: TaskSources = BUNDLED
    stops: StopRequests = field(default_factory=StopRequests)
    streams: StreamHub | None = None  # opens a streaming step's channels

    def load(self) -> TaskSpec:
        return load_task(self.ins.task, self.sources)

    def run(
        self,
        spec: TaskSpec,
        inputs: dict[str, Any],
        exe: Execution,
        files: Callable[[str], bytes] | None = None,
    ) -> Produced:
        """Run the task on its named ``inputs``; store its JSON output and compute time in
        ``exe``; what it produced (a new ``image`` among its objects, or none when it left
        the image unchanged). ``files`` reads the input files the task asks for
        (``TaskContext.read_file``).

        Raises ``TaskTimedOut`` when ``timeout_s`` passes first (``timeout_s <= 0``: no
        limit), ``TaskStopped`` when it is asked to stop; either says ``stuck`` when the
        task did not end then (its thread runs on: no Python thread can be stopped).
        """
        ctx = self._context(spec, files)
        chain = self.ins.chain is not False
        # The task thread takes the inputs out of the box: once the task returns, nothing
        # there refers to them (the pool's work item outlives the call by a moment), so a
        # mapped input is unpinned as soon as the caller drops it.
        box = [dict(inputs)]
        inputs.clear()
        return self._timed(
            spec,
            exe,
            ctx,
            lambda: self._streaming(
                ctx, lambda: run_task_with_inputs(spec, box.pop(), ctx, chain=chain)
            ),
        )

    def _streaming(self, ctx: TaskContext, call: Callable[[], Produced]) -> Produced:
        """``call()``, a streaming step's with its channels open (``streams``): joined to its
        peers first, their streams ended (or broken, when it fails) once it returns."""
        if not self.ins.channels:
            return call()
        if self.streams is None:
            raise InvalidInstruction(
                f"instruction {self.ins.task_run_id}: a streaming step, and this worker has no "
                "channels (it runs without a CDI minion)"
            )
        if self.ins.attempt > 1:
            raise StreamBroken(
                f"streaming step {self.ins.ref!r} cannot run again (attempt {self.ins.attempt}): "
                "the items its channels carried are gone; start the run again"
            )
        channels = self.streams.open(self.ins, ctx.cancelled)
        object.__setattr__(ctx, "streams", channels)  # the context is the task's, made above
        failed = True
        try:
            produced = call()
            # A task that returned once it was stopped did not finish its streams.
            failed = ctx.cancelled.is_set()
            return produced
        finally:
            if channels is not None:
                channels.close(failed=failed)

    def _context(self, spec: TaskSpec, files: Callable[[str], bytes] | None) -> TaskContext:
        data = self.ins.data if isinstance(self.ins.data, dict) else {}
        return TaskContext(
            task_name=spec.name,
            workflow_id=self.ins.workflow_id,
            attempt=self.ins.attempt,
            params=self.ins.params,
            input=data,
            files=files,
        )

    def _timed(
        self, spec: TaskSpec, exe: Execution, ctx: TaskContext, call: Callable[[], Produced]
    ) -> Produced:
        started = time.perf_counter()

        def measured() -> Produced:
            # The task thread's CPU time: the task's own cost, whatever else the host runs.
            cpu = time.thread_time()
            try:
                return call()
            finally:
                exe.cpu_ms = (time.thread_time() - cpu) * 1000.0

        timeout = float(self.ins.timeout_s)
        limited = 0 < timeout < math.inf  # 0 or less (or inf) means no limit
        try:
            with self.stops.watch(self.ins.task_run_id) as watch:
                if watch.request is not None:  # stopped before it began: it does not begin
                    raise TaskStopped(watch.request.reason, status=watch.request.status)
                future = _task_thread().submit(measured)
                if not watch.until_done_or_stopped(future, timeout if limited else None):
                    self._stop(spec, ctx, future, watch.request, timeout)
                produced = future.result()
        finally:
            exe.compute_ms = elapsed_ms(started)
        exe.output = produced.output
        return produced

    def _stop(
        self,
        spec: TaskSpec,
        ctx: TaskContext,
        future: Future[Produced],
        request: StopRequest | None,
        timeout: float,
    ) -> NoReturn:
        """Stop the task behind ``future``: asked to (``request``), or past its ``timeout``.
        Raises what the report says: where the task was, and whether it would not stop."""
        runner = _task_thread()
        ended = ask_to_stop(ctx, future)
        if ended:
            failure = future.exception()
            where = task_traceback(failure) if failure is not None else ""
            if failure is not None:
                clear_frames(failure)  # its frames hold the inputs: they must not pin them
        else:
            _local.thread = None  # it runs on: the slot's next task gets a fresh thread
            frame = sys._current_frames().get(runner.ident or 0)
            where = stack_of(frame) if frame is not None else ""
        stuck = not ended
        if request is None:
            raise TaskTimedOut(spec.name, timeout, where=where, stuck=stuck)
        raise TaskStopped(request.reason, status=request.status, where=where, stuck=stuck)


_Outcome = Produced


class _TaskThread:
    """A daemon thread that runs one worker slot's tasks, one at a time.

    *Why one per slot, not one per task:* starting a thread is a cost every task would pay. Daemon,
    because a task that would not stop must not keep the process from exiting
    (``ThreadPoolExecutor`` joins its threads at exit).
    """

    def __init__(self) -> None:
        self._calls: queue.SimpleQueue[tuple[Callable[[], _Outcome], Future[_Outcome]]]
        self._calls = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name="task", daemon=True)
        self._thread.start()

    @property
    def ident(self) -> int | None:
        return self._thread.ident

    def submit(self, call: Callable[[], _Outcome]) -> Future[_Outcome]:
        future: Future[_Outcome] = Future()
        self._calls.put((call, future))
        return future

    def _serve(self) -> None:
        while True:
            call, future = self._calls.get()
            try:
                future.set_result(call())
            except BaseException as exc:
                future.set_exception(exc)


_local = threading.local()


def _task_thread() -> _TaskThread:
    """The calling slot's task thread (slots are threads of their own)."""
    runner: _TaskThread | None = getattr(_local, "thread", None)
    if runner is None:
        runner = _local.thread = _TaskThread()
    return runner
