"""What the scheduler does with a worker's report: take in what it says of the run's data (the
run's plane's part, ``planes``), start the steps it made possible (or end the run), or retry a
failed attempt.

A report and what follows from it are written together: the task run's outcome, the
hand-backs of its objects, the task runs of the steps it lets start (and of those it made
skipped, or a switch it decided) or the run's end. The reports of a loop turn are written in
one statement (``SchedulerStore.report_later``, recorded by ``flush`` once the turn has read
them all, or before any other statement of the turn). The next steps' instructions go out
before that statement (*send, then record*, ``dispatch``), all in one pipeline (one LPUSH a
worker) once the turn has read its reports (``Dispatcher.hold``); a report that stops or
drives a run again, or is stale, first sends those held, as what it does next tells workers
more (a stop, objects to give back).

The loop takes the reports waiting, up to ``REPORT_BATCH``, in one round trip (``take``): a
script moves them (LMOVE) from the report list into the scheduler's taken list, where they stay
until the turn that read them has committed (``Turn``). A scheduler that dies mid-turn leaves
them there; as it starts again it records each one's outcome on its task run, if that is still
open, and frees the objects it names (``read_again``), before resuming its runs.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any, Final

import redis

import cdi
from cdi import ObjectKey
from orchestrator.contract import keys
from orchestrator.contract.messages import Report
from orchestrator.contract.scripts import MOVE_UP_TO
from orchestrator.contract.vocabulary import TaskRunStatus
from orchestrator.db.run_statements import Finish, Handoff, Placement, Reported
from orchestrator.logs import log_context
from orchestrator.scheduler import ahead, progress
from orchestrator.scheduler.context import SchedulerContext
from orchestrator.scheduler.data import Mode
from orchestrator.scheduler.dispatch import Dispatcher
from orchestrator.scheduler.endings import Endings, completion, described_keys, ended_rows
from orchestrator.scheduler.guarded import guarded
from orchestrator.scheduler.planes import plane_of
from orchestrator.scheduler.planes.objects import holder
from orchestrator.scheduler.redrive import Redrive
from orchestrator.scheduler.runs import Phase, RunState, StepRun
from workflows.binding import IMAGE

__all__ = ["REPORT_BATCH", "Reports"]

log = logging.getLogger(__name__)

# Attempts a step may lose with their workers (killed, restarted, gone silent) on top of its
# own ``retries``, which count only the task's failures. Bounded: a task that kills its worker
# every time (out of memory, a crash in native code) must still end its workflow.
MAX_LOST_ATTEMPTS: Final = 3
# A step whose attempts fail because S3 does not answer (``Report.outage``) is tried again,
# spending none of its ``retries``, for this long from the first such failure in a row, at
# growing intervals of at most ``OUTAGE_BACKOFF_MAX_S``: an S3 outage of a few minutes delays
# the workflow instead of failing it.
OUTAGE_PATIENCE_S: Final = 300.0
OUTAGE_BACKOFF_S: Final = 0.5
OUTAGE_BACKOFF_MAX_S: Final = 5.0
# Reports a loop turn takes at most: their statements go in the turn's one transaction.
REPORT_BATCH: Final = 64

# KEYS: the report list, the taken list, the wake-up list, the report list's bell; ARGV: how
# many reports at most, whether to pop a wake-up too. Moves the reports waiting into the taken
# list (oldest first in the answer), silences the bell once none is left, and pops a wake-up.
_TAKE = (
    MOVE_UP_TO
    + """
if redis.call('LLEN', KEYS[1]) == 0 then redis.call('DEL', KEYS[4]) end
local wake = false
if ARGV[2] == '1' then wake = redis.call('RPOP', KEYS[3]) end
return {taken, wake}
"""
)


class Reports:
    """Turns reports into the runs' next moves."""

    def __init__(
        self, ctx: SchedulerContext, dispatch: Dispatcher, endings: Endings, redrive: Redrive
    ) -> None:
        self.ctx = ctx
        self.dispatch = dispatch
        self.endings = endings
        self.redrive = redrive
        self._take = ctx.redis.register_script(_TAKE)
        ctx.db.before_flush = dispatch.unrecorded  # a turn's instructions go before its records
        self._trim_due = False
        self._read = 0  # reports read since the taken list was last trimmed

    def take(self, *, wake: bool = False) -> tuple[list[str], str | None]:
        """The reports waiting (up to ``REPORT_BATCH``, moved into the taken list) and, with
        ``wake``, a wake-up, in one round trip."""
        ctx = self.ctx
        lists = [ctx.reply_key, ctx.taken_key, keys.WAKE, keys.report_bell_key(ctx.reply_key)]
        taken, woke = self._take(keys=lists, args=[REPORT_BATCH, int(wake)])
        return [str(t) for t in taken], (None if woke is None else str(woke))

    def read_all(self, texts: list[str]) -> None:
        """Handle reports taken by ``take``, oldest first, and record them in one statement
        (``SchedulerStore.flush``); they leave the taken list once the turn has committed what
        they wrote (``Turn``)."""
        self.dispatch.hold()
        for text in texts:
            self.read(text)
        self.dispatch.release()
        guarded(self.ctx.db.flush, self.ctx.faults)
        self._read += len(texts)
        if texts and not self._trim_due:
            self._trim_due = True
            self.ctx.turn.later(self._trim, even_if_rolled_back=True)

    def _trim(self) -> None:
        """What the reports read so far wrote is committed (or was lost with the turn's
        writes, and the tick resyncs with Postgres): they leave the taken list, where they are
        the oldest, at its right end."""
        read, self._read, self._trim_due = self._read, 0, False
        self.ctx.redis.ltrim(self.ctx.taken_key, 0, -read - 1)

    def read_again(self) -> None:
        """As the scheduler starts: the reports its previous process took and had not
        finished with. Each one's outcome is recorded on its task run unless that run has
        ended (``SchedulerStore.late_report``), and the objects it names are freed; the runs
        then go on from what Postgres has (``Claims.resume``)."""
        texts = self.ctx.redis.lrange(self.ctx.taken_key, 0, -1)
        for text in reversed(texts):  # oldest first
            try:
                report = Report.loads(str(text))
            except (ValueError, TypeError):
                log.warning("dropping an unreadable report: %.200s", text)
                continue
            if self.ctx.db.late_report(report):
                log.info("recorded task run %s from its report, read again after a restart",
                         report.task_run_id)  # fmt: skip
            self.endings.drop_stale(report)
        if texts:  # all of them leave once those records are committed
            self.ctx.turn.later(self._trim_all)

    def _trim_all(self) -> None:
        self.ctx.redis.delete(self.ctx.taken_key)

    def read(self, text: str | bytes) -> None:
        """Handle one report as it came off the list; an unreadable one is dropped."""
        try:
            report = Report.loads(text)
        except (ValueError, TypeError):
            log.warning("dropping an unreadable report: %.200s", text)
            return
        with log_context(workflow_id=report.workflow_id, task_run_id=report.task_run_id):
            guarded(lambda: self.handle(report), self.ctx.faults)

    def handle(self, report: Report) -> None:
        if report.restarting:
            self.dispatch.restarting(report.worker_id)
        run = self.ctx.runs.get(uuid.UUID(report.workflow_id))
        step = run.flight(report.task_run_id) if run is not None else None
        if run is None or step is None or step.in_flight is None:
            log.info("stale report for task run %s", report.task_run_id)
            self.dispatch.release()  # the instructions held go before what follows
            self.endings.drop_stale(report)
            return
        flight = step.in_flight
        ins = flight.instruction
        self.dispatch.returned(flight)
        step.in_flight = None
        completed = report.status == TaskRunStatus.COMPLETED
        made_keys = _made(report)
        back = self._hand_backs(run, step, report, made_keys)
        got = plane_of(run).received(self.ctx, run, step, report, ins)
        ahead.stamp(run, flight, made_keys)
        moves = progress.Moves()
        made: dict[str, Any] | None = None
        if got.made is not None:
            run_s = max(0.0, report.finished_at - report.started_at)
            self.dispatch.ran(step.current.task, run_s, report.bytes_out)
            made = {"made": {n: d.describe() for n, d in got.made.items()}}
            if got.results:
                made["results"] = got.results
                run.results.update({f"{step.id}.{n}": u for n, u in got.results.items()})
            progress.done(run, step, got.made, report.output, moves)
        for key in got.shared:  # after ``done``: a datum passed on unchanged reads it on
            progress.read_done(run, key, report.worker_id, moves)
        placements: list[Placement] = []
        finish: Finish | None = None
        if completed and not run.cancelled and not moves.failure:
            placements = self._place(run, moves)
            if run.finished:
                finish = completion(run, self.ctx.objects)
        rows = [*placements, *ended_rows(self.ctx.db, run, moves)]
        # The report and the next steps' task runs, or the run's end, are recorded with the
        # turn's other reports in one statement (before any other of the turn's statements).
        recorded = self.ctx.db.report_later(Reported(report, back, rows, finish, made))
        self.endings.free(run, moves.freed)
        if got.lost or not completed or moves.failure or (finish is None and run.cancelled):
            # What follows tells workers more (a stop, objects to give back) or places steps
            # again: the instructions held go first, and the turn's next ones at once.
            self.dispatch.release()
        if got.lost:
            self.after_lost_image(run, step)
        elif not completed and report.objects_gone:
            # An object the scheduler handed out is gone: most likely the minion restarted
            # before the tick noticed. Not the task's fault: no attempt is spent on it.
            self.ctx.faults.minion = True  # the next tick asks the minion
            self.redrive.run(run, f"worker {report.worker_id}: {report.error}")
        elif not completed:
            self._failed(run, step, report)
        elif moves.failure:
            self.endings.fail(run, moves.failure)
        elif finish is not None:
            self.endings.completed(run, recorded)
        elif run.cancelled:
            self.endings.quiet(run)

    def _place(self, run: RunState, moves: progress.Moves) -> list[Placement]:
        """Place what became ready and what the run's parallelism held back until now (this
        report brought one of its step runs back), in the run's order."""
        try:
            return self.dispatch.place(run)
        except (redis.RedisError, cdi.CDIError) as exc:  # the tick's sweep places them later
            log.warning("workflow %s: could not place %s now: %s", run.workflow_id,
                        ", ".join(s.id for s in moves.ready), exc)  # fmt: skip
            self.ctx.faults.minion |= isinstance(exc, cdi.MinionUnavailable)
            return []

    def _failed(self, run: RunState, step: StepRun, report: Report) -> None:
        """A failed attempt. An input recorded at its worker, unopened there, that the
        minion returned to us (that worker's earlier process held it ahead of the step and
        died before a heartbeat said so: ``ahead``) means the task could not run: the attempt
        is lost, not the task's; one gone drives the run again."""
        worker = report.worker_id
        objs = [run.objects.get(k) for k, m in step.modes.items() if m is Mode.OWN]
        owned = [o for o in objs if o is not None and o.owner == worker]
        loads = {w.worker_id: w for w in self.dispatch.loads()} if owned else {}
        try:
            gone = ahead.regain(self.ctx, run, owned, loads)
        except cdi.CDIError as exc:  # the minion is away: the tick looks again
            self.ctx.faults.minion |= isinstance(exc, cdi.MinionUnavailable)
            gone = []
        if gone:
            self.redrive.run(run, f"object {gone[0].key} held by {worker} is gone")
            return
        lost = any(o.owner == self.ctx.id for o in owned)
        reason = report.error or report.status
        self.after_failure(run, step, reason, report.retryable, lost=lost, outage=report.outage)

    def after_failure(
        self,
        run: RunState,
        step: StepRun,
        reason: str,
        retryable: bool,
        *,
        lost: bool = False,
        outage: bool = False,
    ) -> None:
        """A failed attempt of ``step``: retry it after its backoff, or fail the run. A
        ``lost`` attempt (its worker died) spends none of the step's ``retries``, up to
        ``MAX_LOST_ATTEMPTS``; nor does an ``outage`` (S3 did not answer), for up to
        ``OUTAGE_PATIENCE_S``."""
        spec = step.current
        step.phase = Phase.READY
        now = time.monotonic()
        step.lost += lost
        step.outages += outage
        step.outage_since = (step.outage_since or now) if outage else 0.0
        own_failures = step.attempt - step.lost - step.outages
        if run.cancelled:
            self.endings.quiet(run)
        elif outage and now - step.outage_since <= OUTAGE_PATIENCE_S:
            backoff = OUTAGE_BACKOFF_S * 2 ** min(step.outages - 1, 8)
            self._retry(step, now + min(OUTAGE_BACKOFF_MAX_S, backoff))
        elif outage:
            self.endings.fail(
                run, f"task {step.id!r} failed after {step.attempt} attempt(s): S3 has not "
                f"answered for {OUTAGE_PATIENCE_S:g} s: {reason}",
            )  # fmt: skip
        elif retryable and own_failures <= spec.retries and step.lost <= MAX_LOST_ATTEMPTS:
            self._retry(step, now + spec.retry_backoff_s * 2 ** (own_failures + step.lost - 1))
        else:
            self.endings.fail(
                run, f"task {step.id!r} failed after {step.attempt} attempt(s): {reason}"
            )

    def _retry(self, step: StepRun, at: float) -> None:
        step.retry_at = at
        step.attempt += 1
        self.ctx.tick.by(step.retry_at)  # the tick dispatches it

    def after_lost_image(self, run: RunState, step: StepRun) -> None:
        """The image ``step`` read was lost with its worker's memory: the steps that made it
        run again from the object it was computed from (``progress.rewind``). Those attempts
        count as lost, not as the tasks' failures, so they spend none of the steps' ``retries``
        (up to ``MAX_LOST_ATTEMPTS``)."""
        if run.cancelled:
            self.endings.quiet(run)
            return
        for again in run.steps.values():
            if again.spec is None or again.phase is not Phase.WAITING:
                continue
            if again.lost > MAX_LOST_ATTEMPTS:
                self.endings.fail(run, f"task {again.id!r} lost its image with its worker's "
                                       f"memory {again.lost} times")  # fmt: skip
                return
            if again.attempt - again.lost - again.outages > again.spec.retries + 1:
                self.endings.fail(
                    run, f"task {again.id!r} lost its image with its worker's memory and has "
                    f"no retries left (attempt {again.attempt} of {again.spec.retries + 1})",
                )  # fmt: skip
                return
        moves = progress.settle(run)
        placed = self.dispatch.place(run, moves.ready)
        self.ctx.db.place([*placed, *ended_rows(self.ctx.db, run, moves)])

    # ------------------------------------------------------------------ objects
    def _hand_backs(
        self, run: RunState, step: StepRun, report: Report, made: dict[ObjectKey, str]
    ) -> list[Handoff]:
        """The objects the report's worker handed back to us, or on to the next step's
        worker (``Report.handed_to``): the image and named outputs it made (``made``), and the
        inputs it gave back."""
        worker = report.worker_id
        back = []
        for key in dict.fromkeys([*made, *report.returned]):
            dst = holder(self.ctx, report, key) if key in made else self.ctx.id
            if dst == worker:
                continue  # kept
            obj = run.objects.get(key)
            nbytes = obj.nbytes if obj is not None else report.bytes_out
            named = f"{step.id}.{made[key]}" if key in made else ""
            datum = obj.datum if obj is not None else named
            back.append(Handoff(
                worker, dst, nbytes, report.return_us, self.dispatch.host_of(worker),
                self.ctx.cdi.host if dst == self.ctx.id else self.dispatch.host_of(dst),
                datum=datum, mode="transfer",
            ))  # fmt: skip
        return back


def _made(report: Report) -> dict[ObjectKey, str]:
    """The objects a report says its step made (its image and named outputs), by output."""
    made = dict.fromkeys([report.key] if report.key else [], IMAGE)
    return made | {k: n for n, d in report.objects.items() for k in described_keys(d)}
